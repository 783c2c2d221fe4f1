// Disentangled attention on the CPU, fused: inference (`forward`) and training (`train_forward`, which keeps
// the probabilities, and `train_backward`), one pass per (batch, head) that keeps every intermediate in the
// core's cache.
//
// For distance i - j (REFERENCE.md §1-2) the scores of query i against key j are
//
//     s(i, j) = scale·q_i·k_j + C[i, idx(i - j)] + P[j, idx(i - j)]
//
// with C = q·Kr^T (c2p, plus p2p) and P = k·Qr^T (p2c), both N×R (the paper's Algorithm 1); the position
// projections Kr, Qr and the p2p values arrive already multiplied by the scale. The pure PyTorch path writes
// C and P, gathers them into two B·H·N·N tensors, adds them and hands the sum to the fused attention kernel
// as a mask: five trips through memory for every score. Here, per (batch, head): P once (N×R), then per block
// of 128 query rows: the block's scores (one GEMM), its C rows (one GEMM), the two lookups added in place, the
// masked softmax, and the output rows (one GEMM). Hidden pairs get probability exactly 0; a row with no
// visible key gets zeros (the contract of every backend). The backward is the same walk: GEMMs for the
// gradients of v, the probabilities, q and k, and the bias gradient scattered back into the N×R row terms
// (the transpose of the lookups; saturated pairs summed into their one row per side).

// The headers of what is used, not <torch/extension.h> (all of PyTorch's C++ frontend): the first call's build
// takes 17 s instead of 35 s on a 2-core machine (cpu_kernel.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

// The BLAS linked into libtorch_cpu (MKL on x86-64 wheels) exports the Fortran interface; ATen's own gemm
// wrapper for float is not exported to extensions.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

constexpr int64_t kBlock = 128;  // query rows per block (fewer make the GEMMs slower even where scores spill L2)

// Row-major C(m×n) = alpha·op(A)·op(B) + beta·C with op(A) = A^T (A stored k×m) when trans_a, else A (m×k),
// and op(B) = B^T (B stored n×k) when trans_b, else B (k×n). BLAS is column-major: the same memory read
// column-major is C^T = op(B)^T·op(A)^T.
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  const int mm = static_cast<int>(n), nn = static_cast<int>(m), kk = static_cast<int>(k);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  sgemm_(&ta, &tb, &mm, &nn, &kk, &alpha, b, &la, a, &lb, &beta, c, &lc);
}

// exp for x <= 0 (scores minus their row maximum), Cephes' single-precision polynomial: a loop of plain
// arithmetic, so the compiler vectorises it (std::exp would be a scalar call per element).
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// softmax of s[0, n) in place over the keys where visible[j] (all when visible is null); hidden keys get 0,
// and so does every key of a row where none is visible.
void softmax_row(float* s, int64_t n, const bool* visible) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (visible != nullptr) {
    for (int64_t j = 0; j < n; ++j) s[j] = visible[j] ? s[j] : kNegInf;
  }
  float mx = kNegInf;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  if (mx == kNegInf) {
    std::fill(s, s + n, 0.0f);
    return;
  }
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float e = exp_nonpositive(s[j] - mx);  // hidden keys: exp(-87), zeroed below
    s[j] = e;
    sum += e;
  }
  if (visible != nullptr) {
    sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      s[j] = visible[j] ? s[j] : 0.0f;
      sum += s[j];
    }
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

// row[j] += c + p[j] over [j0, j1) (p null: c alone): the saturated pairs of one query row.
inline void far_terms(float* row, int64_t j0, int64_t j1, float c, const float* p) {
  if (p != nullptr) {
    for (int64_t j = j0; j < j1; ++j) row[j] += c + p[j];
  } else {
    for (int64_t j = j0; j < j1; ++j) row[j] += c;
  }
}

// kept (bq × nk, compact) = probabilities where the dropout mask keeps them, else 0; p and keep have row
// stride ld
void kept_block(const float* p, const bool* keep, int64_t ld, int64_t bq, int64_t nk, float* kept) {
  for (int64_t a = 0; a < bq; ++a) {
    for (int64_t j = 0; j < nk; ++j) kept[a * nk + j] = keep[a * ld + j] ? p[a * ld + j] : 0.0f;
  }
}

// Who sees whom and through which table row; shared by every pass.
struct Layout {
  int64_t N = 0, R = 0, sat = 1;
  const int32_t* index = nullptr;  // table row of distance d = i - j at d + N - 1 (null: no position terms)
  const int32_t* start = nullptr;  // keys [start[i], end[i]) query i may see at all
  const int32_t* end = nullptr;
  int32_t row_left = 0, row_right = 0;  // table rows at distance +sat and -sat (constant beyond)

  Layout(int64_t n, int64_t r, int64_t saturation, const at::Tensor& idx, const at::Tensor& key_start,
         const at::Tensor& key_end)
      : N(n), R(r), sat(std::clamp<int64_t>(saturation, 1, std::max<int64_t>(n, 1))) {
    for (const auto* t : {&key_start, &key_end}) {
      TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous() && t->numel() == N,
                  "key_start and key_end must be contiguous int32 with N = ", N, " entries");
    }
    start = key_start.data_ptr<int32_t>();
    end = key_end.data_ptr<int32_t>();
    for (int64_t i = 0; i < N; ++i) {
      TORCH_CHECK(0 <= start[i] && start[i] <= end[i] && end[i] <= N, "key window of query ", i, " is [",
                  start[i], ", ", end[i], "), expected 0 <= start <= end <= N = ", N);
    }
    if (idx.numel() > 0) {
      TORCH_CHECK(idx.scalar_type() == at::kInt && idx.is_contiguous() && idx.numel() == 2 * N - 1,
                  "index must be contiguous int32 with 2N - 1 = ", 2 * N - 1, " entries, got ", idx.numel());
      index = idx.data_ptr<int32_t>();
      for (int64_t d = 0; d < 2 * N - 1; ++d) {
        TORCH_CHECK(0 <= index[d] && index[d] < R, "table row ", index[d], " of distance ", d - (N - 1),
                    " is outside the ", R, " projected rows");
      }
      row_left = index[std::min(N - 1 + sat, 2 * N - 2)];
      row_right = index[std::max<int64_t>(N - 1 - sat, 0)];
    }
  }

  // keys [ks, ke) that some row of [i0, i0 + bq) may see (ke <= ks: none)
  std::pair<int64_t, int64_t> block_keys(int64_t i0, int64_t bq) const {
    int64_t ks = N, ke = 0;
    for (int64_t i = i0; i < i0 + bq; ++i) {
      if (end[i] > start[i]) ks = std::min<int64_t>(ks, start[i]), ke = std::max<int64_t>(ke, end[i]);
    }
    return {ks, ke};
  }

  // row i's keys relative to ks, inside [0, nk) (a row that sees no key may lie outside the block's keys)
  std::pair<int64_t, int64_t> window(int64_t i, int64_t ks, int64_t nk) const {
    const int64_t j0 = std::clamp<int64_t>(start[i] - ks, 0, nk);
    return {j0, std::clamp<int64_t>(end[i] - ks, j0, nk)};
  }

  // [b0, b1) within [j0, j1): keys closer than sat to query i (before: distance >= sat; after: <= -sat)
  std::pair<int64_t, int64_t> band(int64_t i, int64_t ks, int64_t j0, int64_t j1) const {
    const int64_t b0 = std::clamp<int64_t>(i - sat + 1 - ks, j0, j1);
    return {b0, std::clamp<int64_t>(i + sat - ks, b0, j1)};
  }

  // ix[-j] is the table row of query i against key ks + j
  const int32_t* rows_of(int64_t i, int64_t ks) const { return index + i + N - 1 - ks; }

  // row[j] += c[idx] + p[j·R + idx] over the window [j0, j1) of query i (c: the query's c2p (+ p2p) row
  // or null; p: p2c rows from key ks on, or null; far_l, far_r: p2c of the keys at +-sat, from ks on)
  void add_terms(float* row, int64_t i, int64_t ks, int64_t j0, int64_t j1, const float* c, const float* p,
                 const float* far_l, const float* far_r) const {
    if (index == nullptr || j1 <= j0) return;
    const auto [b0, b1] = band(i, ks, j0, j1);
    far_terms(row, j0, b0, c ? c[row_left] : 0.0f, far_l);
    far_terms(row, b1, j1, c ? c[row_right] : 0.0f, far_r);
    const int32_t* ix = rows_of(i, ks);
    if (c) {
      for (int64_t j = b0; j < b1; ++j) row[j] += c[ix[-j]];
    }
    if (p) {
      for (int64_t j = b0; j < b1; ++j) row[j] += p[j * R + ix[-j]];
    }
  }

  // query i's probabilities over the block's keys [ks, ks + nk) in place of its scores row[0, nk): the position
  // terms added over its window, the masked softmax there (visible: the batch element's key mask from ks on,
  // or null), zeros outside it
  void probabilities(float* row, int64_t i, int64_t ks, int64_t nk, const float* c, const float* p,
                     const float* far_l, const float* far_r, const bool* visible) const {
    const auto [j0, j1] = window(i, ks, nk);
    add_terms(row, i, ks, j0, j1, c, p, far_l, far_r);
    std::fill(row, row + j0, 0.0f);
    softmax_row(row + j0, j1 - j0, visible ? visible + j0 : nullptr);
    std::fill(row + j1, row + nk, 0.0f);
  }

  // the transpose of add_terms: g[j] over the window [j0, j1) of query i into the c2p row gc (or null),
  // the p2c rows gp from key ks on (or null) and the saturated p2c sums gfar_l, gfar_r (from ks on)
  void scatter_terms(const float* g, int64_t i, int64_t ks, int64_t j0, int64_t j1, float* gc, float* gp,
                     float* gfar_l, float* gfar_r) const {
    if (index == nullptr || j1 <= j0) return;
    const auto [b0, b1] = band(i, ks, j0, j1);
    if (gc) {
      float left = 0.0f, right = 0.0f;
#pragma omp simd reduction(+ : left)
      for (int64_t j = j0; j < b0; ++j) left += g[j];
#pragma omp simd reduction(+ : right)
      for (int64_t j = b1; j < j1; ++j) right += g[j];
      gc[row_left] += left;
      gc[row_right] += right;
    }
    if (gp) {
      for (int64_t j = j0; j < b0; ++j) gfar_l[j] += g[j];
      for (int64_t j = b1; j < j1; ++j) gfar_r[j] += g[j];
    }
    const int32_t* ix = rows_of(i, ks);
    if (gc) {
      for (int64_t j = b0; j < b1; ++j) gc[ix[-j]] += g[j];
    }
    if (gp) {
      for (int64_t j = b0; j < b1; ++j) gp[j * R + ix[-j]] += g[j];
    }
  }
};

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes(), "q and k must be (B, H, N, D) of one shape, got ",
              q.sizes(), " and ", k.sizes());
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "v must be (B, H, N, Dv) matching q ", q.sizes(), ", got ", v.sizes());
}

void check_float(std::initializer_list<const at::Tensor*> ts) {
  for (const auto* t : ts) {
    TORCH_CHECK(t->numel() == 0 || (t->scalar_type() == at::kFloat && t->is_contiguous()),
                "every tensor must be contiguous float32, got ", t->scalar_type());
  }
}

const bool* mask_ptr(const at::Tensor& key_mask, int64_t B, int64_t N) {
  if (key_mask.numel() == 0) return nullptr;
  TORCH_CHECK(key_mask.scalar_type() == at::kBool && key_mask.dim() == 2 && key_mask.size(0) == B &&
                  key_mask.size(1) == N && key_mask.is_contiguous(),
              "key_mask must be a contiguous (B, N) bool tensor, got ", key_mask.sizes());
  return key_mask.data_ptr<bool>();
}

template <typename T>
const T* ptr_or_null(const at::Tensor& t) {
  return t.numel() > 0 ? t.data_ptr<T>() : nullptr;
}

// p2c of every key at the two saturated rows: far_l[j] = p[j, row_left], far_r[j] = p[j, row_right]
void far_columns(const Layout& L, const float* p, float* far_l, float* far_r) {
  for (int64_t j = 0; j < L.N; ++j) far_l[j] = p[j * L.R + L.row_left], far_r[j] = p[j * L.R + L.row_right];
}

}  // namespace

// Inference. q, k: (B, H, N, D); v: (B, H, N, Dv); pos_k, pos_q: (H, R, D) or empty; p2p: (H, R) or empty (all
// float32, contiguous; the position terms already scaled). index: (2N - 1,) int32, the table row of distance
// d = i - j at d + N - 1 (empty without position terms). key_mask: (B, N) bool or empty. key_start, key_end:
// (N,) int32, the keys [key_start[i], key_end[i]) query i may see at all (its packed sequence; causal cuts the
// end at i + 1). saturation: the distance from which the index is constant (|i - j| >= saturation uses the
// rows at +-saturation). Returns (B, H, N, Dv) float32.
at::Tensor forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor pos_k, at::Tensor pos_q, at::Tensor p2p,
                   at::Tensor index, at::Tensor key_mask, at::Tensor key_start, at::Tensor key_end,
                   int64_t saturation, double scale) {
  check_qkv(q, k, v);
  check_float({&q, &k, &v, &pos_k, &pos_q, &p2p});
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), Dv = v.size(3);
  const bool c2p = pos_k.numel() > 0, p2c = pos_q.numel() > 0, pp = p2p.numel() > 0;
  const int64_t R = c2p ? pos_k.size(1) : (p2c ? pos_q.size(1) : (pp ? p2p.size(1) : 0));
  TORCH_CHECK(!c2p || (pos_k.dim() == 3 && pos_k.size(0) == H && pos_k.size(2) == D),
              "pos_k must be (H, R, D), got ", pos_k.sizes());
  TORCH_CHECK(!p2c || (pos_q.dim() == 3 && pos_q.size(0) == H && pos_q.size(1) == R && pos_q.size(2) == D),
              "pos_q must be (H, R, D), got ", pos_q.sizes());
  TORCH_CHECK(!pp || (p2p.dim() == 2 && p2p.size(0) == H && p2p.size(1) == R), "p2p must be (H, R), got ",
              p2p.sizes());
  const Layout L(N, R, saturation, (c2p || p2c || pp) ? index : at::Tensor(), key_start, key_end);
  const bool* mp = mask_ptr(key_mask, B, N);
  auto out = at::empty({B, H, N, Dv}, q.options());
  if (out.numel() == 0) return out;
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *pkp = ptr_or_null<float>(pos_k), *pqp = ptr_or_null<float>(pos_q), *ppp = ptr_or_null<float>(p2p);
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  // one block of query rows of head bh, given that head's p2c rows P (N×R) and their saturated columns
  auto block = [&](int64_t bh, int64_t i0, const float* P, const float* far_l, const float* far_r, float* C,
                   float* s) {
    const int64_t b = bh / H, h = bh % H, bq = std::min(kBlock, N - i0);
    const float *qh = qp + bh * N * D, *kh = kp + bh * N * D, *vh = vp + bh * N * Dv;
    float* oh = op + bh * N * Dv;
    const auto [ks, ke] = L.block_keys(i0, bq);
    if (ke <= ks) {
      std::fill(oh + i0 * Dv, oh + (i0 + bq) * Dv, 0.0f);
      return;
    }
    const int64_t nk = ke - ks;
    gemm(false, true, bq, nk, D, fscale, qh + i0 * D, D, kh + ks * D, D, 0.0f, s, nk);  // scale·q·k^T
    if (c2p) gemm(false, true, bq, R, D, 1.0f, qh + i0 * D, D, pkp + h * R * D, D, 0.0f, C, R);
    for (int64_t a = 0; pp && a < bq; ++a) {
      const float* pr = ppp + h * R;
      for (int64_t r = 0; r < R; ++r) C[a * R + r] = (c2p ? C[a * R + r] : 0.0f) + pr[r];
    }
    for (int64_t a = 0; a < bq; ++a) {
      L.probabilities(s + a * nk, i0 + a, ks, nk, (c2p || pp) ? C + a * R : nullptr, P ? P + ks * R : nullptr,
                      P ? far_l + ks : nullptr, P ? far_r + ks : nullptr, mp ? mp + b * N + ks : nullptr);
    }
    gemm(false, false, bq, Dv, nk, 1.0f, s, nk, vh + ks * Dv, Dv, 0.0f, oh + i0 * Dv, Dv);  // probs·v
  };
  // P = k·Qr^T of head bh and its saturated columns
  auto p2c_rows = [&](int64_t bh, float* P, float* far_l, float* far_r) {
    gemm(false, true, N, R, D, 1.0f, kp + bh * N * D, D, pqp + (bh % H) * R * D, D, 0.0f, P, R);
    far_columns(L, P, far_l, far_r);
  };
  const int64_t blocks = (N + kBlock - 1) / kBlock;

  if (B * H >= at::get_num_threads() || blocks == 1) {  // a task per head: its P stays in the thread's cache
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> P(p2c ? N * R : 0), C(R > 0 ? kBlock * R : 0), S(kBlock * N);
      std::vector<float> far_l(p2c ? N : 0), far_r(p2c ? N : 0);
      for (int64_t bh = begin; bh < end; ++bh) {
        if (p2c) p2c_rows(bh, P.data(), far_l.data(), far_r.data());
        for (int64_t i0 = 0; i0 < N; i0 += kBlock) {
          block(bh, i0, p2c ? P.data() : nullptr, far_l.data(), far_r.data(), C.data(), S.data());
        }
      }
    });
    return out;
  }
  // fewer heads than threads (batch 1 on a many-core machine): P of every head first, then a task per block
  std::vector<float> P(p2c ? B * H * N * R : 0), far_l(p2c ? B * H * N : 0), far_r(p2c ? B * H * N : 0);
  if (p2c) {
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        p2c_rows(bh, P.data() + bh * N * R, far_l.data() + bh * N, far_r.data() + bh * N);
      }
    });
  }
  at::parallel_for(0, B * H * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> C(R > 0 ? kBlock * R : 0), S(kBlock * N);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t bh = t / blocks;
      const int64_t i0 = (t % blocks) * kBlock;
      if (p2c) {
        block(bh, i0, P.data() + bh * N * R, far_l.data() + bh * N, far_r.data() + bh * N, C.data(), S.data());
      } else {
        block(bh, i0, nullptr, nullptr, nullptr, C.data(), S.data());
      }
    }
  });
  return out;
}

// Training, forward. c2p_rows: (B, H, N, R) c2p (+ p2p) of every query against every table row, or empty;
// p2c_rows: (B, H, N, R) or empty (both scaled); keep: (B, H, N, N) bool dropout mask or empty, kept values
// scaled by drop_scale. Returns the output (B, H, N, Dv) and the probabilities (B, H, N, N) (before dropout,
// zero for hidden pairs) that the backward pass needs.
std::vector<at::Tensor> train_forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor c2p_rows,
                                      at::Tensor p2c_rows, at::Tensor index, at::Tensor key_mask,
                                      at::Tensor key_start, at::Tensor key_end, int64_t saturation, double scale,
                                      at::Tensor keep, double drop_scale) {
  check_qkv(q, k, v);
  check_float({&q, &k, &v, &c2p_rows, &p2c_rows});
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), Dv = v.size(3);
  const bool c2p = c2p_rows.numel() > 0, p2c = p2c_rows.numel() > 0;
  const int64_t R = c2p ? c2p_rows.size(3) : (p2c ? p2c_rows.size(3) : 0);
  for (const auto* t : {&c2p_rows, &p2c_rows}) {
    TORCH_CHECK(t->numel() == 0 || (t->dim() == 4 && t->size(0) == B && t->size(1) == H && t->size(2) == N &&
                                    t->size(3) == R),
                "c2p_rows and p2c_rows must be (B, H, N, R) = (", B, ", ", H, ", ", N, ", ", R, "), got ",
                t->sizes());
  }
  TORCH_CHECK(keep.numel() == 0 || (keep.scalar_type() == at::kBool && keep.is_contiguous() &&
                                    keep.sizes() == at::IntArrayRef({B, H, N, N})),
              "keep must be a contiguous (B, H, N, N) bool tensor, got ", keep.sizes());
  const Layout L(N, R, saturation, (c2p || p2c) ? index : at::Tensor(), key_start, key_end);
  const bool* mp = mask_ptr(key_mask, B, N);
  auto out = at::empty({B, H, N, Dv}, q.options());
  auto probs = at::empty({B, H, N, N}, q.options());
  if (out.numel() == 0 || probs.numel() == 0) return {out.zero_(), probs};
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *cp = ptr_or_null<float>(c2p_rows), *pp = ptr_or_null<float>(p2c_rows);
  const bool* keep_p = ptr_or_null<bool>(keep);
  float *op = out.data_ptr<float>(), *probs_p = probs.data_ptr<float>();
  const float fscale = static_cast<float>(scale), fdrop = static_cast<float>(drop_scale);

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> far_l(p2c ? N : 0), far_r(p2c ? N : 0), kept(keep_p ? kBlock * N : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H;
      const float *qh = qp + bh * N * D, *kh = kp + bh * N * D, *vh = vp + bh * N * Dv;
      const float *ch = cp ? cp + bh * N * R : nullptr, *ph = pp ? pp + bh * N * R : nullptr;
      float *oh = op + bh * N * Dv, *prob_h = probs_p + bh * N * N;
      if (p2c) far_columns(L, ph, far_l.data(), far_r.data());
      for (int64_t i0 = 0; i0 < N; i0 += kBlock) {
        const int64_t bq = std::min(kBlock, N - i0);
        const auto [ks, ke] = L.block_keys(i0, bq);
        float* s = prob_h + i0 * N;  // the block's rows of the probabilities, keys ks on
        if (ke <= ks) {
          std::fill(s, s + bq * N, 0.0f);
          std::fill(oh + i0 * Dv, oh + (i0 + bq) * Dv, 0.0f);
          continue;
        }
        const int64_t nk = ke - ks;
        gemm(false, true, bq, nk, D, fscale, qh + i0 * D, D, kh + ks * D, D, 0.0f, s + ks, N);
        for (int64_t a = 0; a < bq; ++a) {  // the full row of N is kept: zeros outside [ks, ke)
          const int64_t i = i0 + a;
          float* row = s + a * N;
          L.probabilities(row + ks, i, ks, nk, ch ? ch + i * R : nullptr, ph ? ph + ks * R : nullptr,
                          p2c ? far_l.data() + ks : nullptr, p2c ? far_r.data() + ks : nullptr,
                          mp ? mp + b * N + ks : nullptr);
          std::fill(row, row + ks, 0.0f);
          std::fill(row + ke, row + N, 0.0f);
        }
        const float* lhs = s + ks;
        int64_t ld = N;
        if (keep_p) {  // dropped probabilities, for the output only
          kept_block(s + ks, keep_p + (bh * N + i0) * N + ks, N, bq, nk, kept.data());
          lhs = kept.data(), ld = nk;
        }
        gemm(false, false, bq, Dv, nk, fdrop, lhs, ld, vh + ks * Dv, Dv, 0.0f, oh + i0 * Dv, Dv);
      }
    }
  });
  return {out, probs};
}

// Training, backward: from the output gradient (B, H, N, Dv) and the forward's probabilities and dropout mask,
// the gradients of q, k, v and of the c2p and p2c rows ((B, H, N, R) each, empty where not wanted).
std::vector<at::Tensor> train_backward(at::Tensor grad_out, at::Tensor q, at::Tensor k, at::Tensor v,
                                       at::Tensor probs, at::Tensor keep, double drop_scale, at::Tensor index,
                                       at::Tensor key_start, at::Tensor key_end, int64_t saturation, double scale,
                                       int64_t R, bool want_c2p, bool want_p2c) {
  check_qkv(q, k, v);
  check_float({&grad_out, &q, &k, &v, &probs});
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), Dv = v.size(3);
  TORCH_CHECK(grad_out.sizes() == v.sizes(), "grad_out must be ", v.sizes(), ", got ", grad_out.sizes());
  TORCH_CHECK(probs.sizes() == at::IntArrayRef({B, H, N, N}), "probs must be (B, H, N, N), got ",
              probs.sizes());
  TORCH_CHECK(keep.numel() == 0 || (keep.scalar_type() == at::kBool && keep.sizes() == probs.sizes() &&
                                    keep.is_contiguous()),
              "keep must be a contiguous (B, H, N, N) bool tensor");
  want_c2p = want_c2p && R > 0 && index.numel() > 0;
  want_p2c = want_p2c && R > 0 && index.numel() > 0;
  const Layout L(N, R, saturation, (want_c2p || want_p2c) ? index : at::Tensor(), key_start, key_end);
  auto gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  auto gc = want_c2p ? at::empty({B, H, N, R}, q.options()) : at::empty({0}, q.options());
  auto gpt = want_p2c ? at::empty({B, H, N, R}, q.options()) : at::empty({0}, q.options());
  const float *go = grad_out.data_ptr<float>(), *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>();
  const float *vp = v.data_ptr<float>(), *probs_p = probs.data_ptr<float>();
  const bool* keep_p = ptr_or_null<bool>(keep);
  float *gqp = gq.data_ptr<float>(), *gkp = gk.data_ptr<float>(), *gvp = gv.data_ptr<float>();
  float *gcp = want_c2p ? gc.data_ptr<float>() : nullptr, *gpp = want_p2c ? gpt.data_ptr<float>() : nullptr;
  const float fscale = static_cast<float>(scale), fdrop = static_cast<float>(drop_scale);

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> gs(kBlock * N), kept(keep_p ? kBlock * N : 0), gfar_l(want_p2c ? N : 0),
        gfar_r(want_p2c ? N : 0);
    for (int64_t bh = begin; bh < end; ++bh) {
      const float *goh = go + bh * N * Dv, *qh = qp + bh * N * D, *kh = kp + bh * N * D, *vh = vp + bh * N * Dv;
      const float* prob_h = probs_p + bh * N * N;
      float *gqh = gqp + bh * N * D, *gkh = gkp + bh * N * D, *gvh = gvp + bh * N * Dv;
      float *gch = gcp ? gcp + bh * N * R : nullptr, *gph = gpp ? gpp + bh * N * R : nullptr;
      std::fill(gkh, gkh + N * D, 0.0f);
      std::fill(gvh, gvh + N * Dv, 0.0f);
      if (gch) std::fill(gch, gch + N * R, 0.0f);
      if (gph) {
        std::fill(gph, gph + N * R, 0.0f);
        std::fill(gfar_l.begin(), gfar_l.end(), 0.0f);
        std::fill(gfar_r.begin(), gfar_r.end(), 0.0f);
      }
      for (int64_t i0 = 0; i0 < N; i0 += kBlock) {
        const int64_t bq = std::min(kBlock, N - i0);
        const auto [ks, ke] = L.block_keys(i0, bq);
        if (ke <= ks) {
          std::fill(gqh + i0 * D, gqh + (i0 + bq) * D, 0.0f);
          continue;
        }
        const int64_t nk = ke - ks;
        const float* p = prob_h + i0 * N + ks;  // the block's probabilities, ld N
        const float* used = p;                   // what multiplied v: the kept probabilities
        int64_t ld_used = N;
        const bool* kb = keep_p ? keep_p + (bh * N + i0) * N + ks : nullptr;
        if (kb) {
          kept_block(p, kb, N, bq, nk, kept.data());
          used = kept.data(), ld_used = nk;
        }
        const float* gob = goh + i0 * Dv;
        // grad v += drop_scale · used^T · grad_out
        gemm(true, false, nk, Dv, bq, fdrop, used, ld_used, gob, Dv, 1.0f, gvh + ks * Dv, Dv);
        // grad of the probabilities: drop_scale · grad_out · v^T, dropped entries 0
        float* g = gs.data();
        gemm(false, true, bq, nk, Dv, fdrop, gob, Dv, vh + ks * Dv, Dv, 0.0f, g, nk);
        for (int64_t a = 0; a < bq; ++a) {  // softmax backward: p · (g - sum(g · p)), in place
          float* ga = g + a * nk;
          const float* pa = p + a * N;
          if (kb) {
            for (int64_t j = 0; j < nk; ++j) ga[j] = kb[a * N + j] ? ga[j] : 0.0f;
          }
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t j = 0; j < nk; ++j) dot += ga[j] * pa[j];
          for (int64_t j = 0; j < nk; ++j) ga[j] = pa[j] * (ga[j] - dot);
          const int64_t i = i0 + a;
          const auto [j0, j1] = L.window(i, ks, nk);
          L.scatter_terms(ga, i, ks, j0, j1, gch ? gch + i * R : nullptr, gph ? gph + ks * R : nullptr,
                          gph ? gfar_l.data() + ks : nullptr, gph ? gfar_r.data() + ks : nullptr);
        }
        // grad q = scale · gs · k; grad k += scale · gs^T · q
        gemm(false, false, bq, D, nk, fscale, g, nk, kh + ks * D, D, 0.0f, gqh + i0 * D, D);
        gemm(true, false, nk, D, bq, fscale, g, nk, qh + i0 * D, D, 1.0f, gkh + ks * D, D);
      }
      if (gph) {
        for (int64_t j = 0; j < N; ++j) gph[j * R + L.row_left] += gfar_l[j], gph[j * R + L.row_right] += gfar_r[j];
      }
    }
  });
  return {gq, gk, gv, gc, gpt};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused disentangled attention at inference: float32, distance i - j");
  m.def("train_forward", &train_forward, "training forward: output and probabilities");
  m.def("train_backward", &train_backward, "training backward: gradients of q, k, v, c2p and p2c rows");
}
