"""Readers for fine-tuning tasks (GLUE, SQuAD, CoNLL NER, multiple choice, users' own files) and the registry.

Every reader takes a local file and returns a `TaskData` of plain records. Malformed rows raise
`MalformedRowError` (a `ValueError` naming the file and line); with `skip_bad=True` they are skipped and
counted in `TaskData.skipped` (and logged).
"""

from debertakit.data.tasks.choice import read_multiple_choice
from debertakit.data.tasks.conll import CONLL2003_LABELS, iob1_to_iob2, read_conll
from debertakit.data.tasks.generic import read_text_pairs
from debertakit.data.tasks.glue import GLUE_FORMATS, GlueFormat, read_glue
from debertakit.data.tasks.records import (
    Answer,
    ChoiceExample,
    MalformedRowError,
    QAExample,
    TaskData,
    TextExample,
    TokenExample,
)
from debertakit.data.tasks.registry import TASKS, TaskKind, TaskSpec, get_task, read_task
from debertakit.data.tasks.squad import read_squad

__all__ = [
    "CONLL2003_LABELS",
    "GLUE_FORMATS",
    "TASKS",
    "Answer",
    "ChoiceExample",
    "GlueFormat",
    "MalformedRowError",
    "QAExample",
    "TaskData",
    "TaskKind",
    "TaskSpec",
    "TextExample",
    "TokenExample",
    "get_task",
    "iob1_to_iob2",
    "read_conll",
    "read_glue",
    "read_multiple_choice",
    "read_squad",
    "read_task",
    "read_text_pairs",
]
