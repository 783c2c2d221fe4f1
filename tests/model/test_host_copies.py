"""A forward on an accelerator copies nothing from the host after its first call.

A copy from pageable host memory synchronises the device's stream: one in every layer would make the host wait
for the GPU layer after layer instead of queueing work ahead. The model runs on the ``meta`` device here, which
stands for an accelerator (no GPU needed): every op that turns a host tensor into a device tensor is recorded.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from debertakit import DebertaConfig
from debertakit.model.backbone import DebertaModel


class _HostCopies(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        from_host = any(t.device.type == "cpu" and t.dim() > 0 for t in inputs)
        if from_host and any(t.device.type == "meta" for t in outputs):
            self.ops.append(str(func))
        return out


@pytest.mark.parametrize("preset", ["tiny-v1", "tiny-v3"])
def test_no_host_copies_after_the_first_forward(preset):
    cfg = DebertaConfig.preset(preset)
    model = DebertaModel(cfg).to("meta").eval()
    copies = []
    for n in (24, 24, 40, 24):
        x = torch.empty(2, n, cfg.embedding_dim, device="meta")
        mask = torch.ones(2, n, dtype=torch.long, device="meta")
        with _HostCopies() as probe:
            model(inputs_embeds=x, attention_mask=mask)
        copies.append(probe.ops)
    # the first forward copies the distance table once (not once per layer); a new length may need a new
    # window of it once; a length seen before copies nothing
    assert len(copies[0]) <= 1 and copies[1] == [] and len(copies[2]) <= 1 and copies[3] == []
