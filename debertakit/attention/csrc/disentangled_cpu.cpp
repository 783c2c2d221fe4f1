// Disentangled attention at inference on the CPU, fused: one pass per (batch, head) that keeps every
// intermediate in the core's cache.
//
// For distance i - j (REFERENCE.md §1-2) the scores of query i against key j are
//
//     s(i, j) = scale·q_i·k_j + C[i, idx(i - j)] + P[j, idx(i - j)]
//
// with C = q·Kr^T (c2p, plus p2p) and P = k·Qr^T (p2c), both N×R (the paper's Algorithm 1); the position
// projections Kr, Qr and the p2p values arrive already multiplied by the scale. The pure PyTorch path writes
// C and P, gathers them into two B·H·N·N tensors, adds them and hands the sum to the fused attention kernel
// as a mask: five trips through memory for every score. Here, per (batch, head): P once (N×R), then per block
// of 64 query rows: the block's scores (one GEMM), its C rows (one GEMM), the two lookups added in place, the
// masked softmax, and the output rows (one GEMM). Hidden pairs get probability exactly 0; a row with no
// visible key gets zeros (the contract of every backend).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

// The BLAS linked into libtorch_cpu (MKL on x86-64 wheels) exports the Fortran interface; ATen's own gemm
// wrapper for float is not exported to extensions.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

constexpr int64_t kBlock = 128;  // query rows per block (fewer make the GEMMs slower even where scores spill L2)

// Row-major C(m×n) = alpha·A(m×k)·op(B) + beta·C, op(B) = B^T (B stored n×k) when trans_b, else B (k×n).
// BLAS is column-major: the same memory read column-major is C^T = op(B)^T·A^T.
void gemm(bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = 'N';
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

}  // namespace

// q, k: (B, H, N, D); v: (B, H, N, Dv); pos_k, pos_q: (H, R, D) or empty; p2p: (H, R) or empty (all float32,
// contiguous; the position terms already scaled). index: (2N - 1,) int32, the table row of distance
// d = i - j at d + N - 1 (empty without position terms). key_mask: (B, N) bool or empty. key_start, key_end:
// (N,) int32, the keys [key_start[i], key_end[i]) query i may see at all (its packed sequence; causal cuts the
// end at i + 1). saturation: the distance from which the index is constant (|i - j| >= saturation uses the
// rows at +-saturation). Returns (B, H, N, Dv) float32.
torch::Tensor forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor pos_k,
                      torch::Tensor pos_q, torch::Tensor p2p, torch::Tensor index, torch::Tensor key_mask,
                      torch::Tensor key_start, torch::Tensor key_end, int64_t saturation, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes(), "q and k must be (B, H, N, D) of one shape, got ",
              q.sizes(), " and ", k.sizes());
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "v must be (B, H, N, Dv) matching q ", q.sizes(), ", got ", v.sizes());
  for (const auto* t : {&q, &k, &v, &pos_k, &pos_q, &p2p}) {
    TORCH_CHECK(t->numel() == 0 || (t->scalar_type() == at::kFloat && t->is_contiguous()),
                "q, k, v and the position terms must be contiguous float32");
  }
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3), Dv = v.size(3);
  const bool c2p = pos_k.numel() > 0, p2c = pos_q.numel() > 0, pp = p2p.numel() > 0;
  const bool rel = c2p || p2c || pp;
  const int64_t R = c2p ? pos_k.size(1) : (p2c ? pos_q.size(1) : (pp ? p2p.size(1) : 0));
  TORCH_CHECK(!c2p || (pos_k.dim() == 3 && pos_k.size(0) == H && pos_k.size(1) == R && pos_k.size(2) == D),
              "pos_k must be (H, R, D), got ", pos_k.sizes());
  TORCH_CHECK(!p2c || (pos_q.dim() == 3 && pos_q.size(0) == H && pos_q.size(1) == R && pos_q.size(2) == D),
              "pos_q must be (H, R, D), got ", pos_q.sizes());
  TORCH_CHECK(!pp || (p2p.dim() == 2 && p2p.size(0) == H && p2p.size(1) == R), "p2p must be (H, R), got ",
              p2p.sizes());
  TORCH_CHECK(!rel || (index.scalar_type() == at::kInt && index.is_contiguous() && index.numel() == 2 * N - 1),
              "index must be contiguous int32 with 2N - 1 = ", 2 * N - 1, " entries, got ", index.numel());
  TORCH_CHECK(key_mask.numel() == 0 || (key_mask.scalar_type() == at::kBool && key_mask.dim() == 2 &&
                                        key_mask.size(0) == B && key_mask.size(1) == N && key_mask.is_contiguous()),
              "key_mask must be a contiguous (B, N) bool tensor, got ", key_mask.sizes());
  for (const auto* t : {&key_start, &key_end}) {
    TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous() && t->numel() == N,
                "key_start and key_end must be contiguous int32 with N = ", N, " entries");
  }
  auto out = torch::empty({B, H, N, Dv}, q.options());
  if (out.numel() == 0) return out;

  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* pkp = c2p ? pos_k.data_ptr<float>() : nullptr;
  const float* pqp = p2c ? pos_q.data_ptr<float>() : nullptr;
  const float* ppp = pp ? p2p.data_ptr<float>() : nullptr;
  const int32_t* ixp = rel ? index.data_ptr<int32_t>() : nullptr;
  const bool* mp = key_mask.numel() > 0 ? key_mask.data_ptr<bool>() : nullptr;
  const int32_t* ksp = key_start.data_ptr<int32_t>();
  const int32_t* kep = key_end.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  // table rows of the saturated distances (the index is constant beyond +-sat)
  const int64_t sat = std::clamp<int64_t>(saturation, 1, std::max<int64_t>(N, 1));
  const int32_t row_left = rel ? ixp[std::min(N - 1 + sat, 2 * N - 2)] : 0;
  const int32_t row_right = rel ? ixp[std::max<int64_t>(N - 1 - sat, 0)] : 0;
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> P(p2c ? N * R : 0), C(rel ? kBlock * R : 0), S(kBlock * N);
    std::vector<float> far_left(p2c ? N : 0), far_right(p2c ? N : 0);  // p2c of every key at +-sat
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* qh = qp + bh * N * D;
      const float* kh = kp + bh * N * D;
      const float* vh = vp + bh * N * Dv;
      float* oh = op + bh * N * Dv;
      if (p2c) {
        gemm(true, N, R, D, 1.0f, kh, D, pqp + h * R * D, D, 0.0f, P.data(), R);  // P = k·Qr^T
        for (int64_t j = 0; j < N; ++j) far_left[j] = P[j * R + row_left], far_right[j] = P[j * R + row_right];
      }
      for (int64_t i0 = 0; i0 < N; i0 += kBlock) {
        const int64_t bq = std::min(kBlock, N - i0);
        // keys [ks, ke) that some row of the block may see
        int64_t ks = N, ke = 0;
        for (int64_t i = i0; i < i0 + bq; ++i) {
          if (kep[i] > ksp[i]) ks = std::min<int64_t>(ks, ksp[i]), ke = std::max<int64_t>(ke, kep[i]);
        }
        if (ke <= ks) {
          std::fill(oh + i0 * Dv, oh + (i0 + bq) * Dv, 0.0f);
          continue;
        }
        const int64_t nk = ke - ks;
        float* s = S.data();
        gemm(true, bq, nk, D, fscale, qh + i0 * D, D, kh + ks * D, D, 0.0f, s, nk);  // scale·q·k^T
        if (c2p) gemm(true, bq, R, D, 1.0f, qh + i0 * D, D, pkp + h * R * D, D, 0.0f, C.data(), R);
        if (pp) {
          const float* pr = ppp + h * R;
          for (int64_t a = 0; a < bq; ++a) {
            float* c = C.data() + a * R;
            if (c2p) {
              for (int64_t r = 0; r < R; ++r) c[r] += pr[r];
            } else {
              std::memcpy(c, pr, R * sizeof(float));
            }
          }
        }
        for (int64_t a = 0; a < bq; ++a) {
          const int64_t i = i0 + a;
          float* row = s + a * nk;
          // this row's keys relative to ks, inside [0, nk) (a row that sees no key may lie outside it)
          const int64_t j0 = std::clamp<int64_t>(ksp[i] - ks, 0, nk);
          const int64_t j1 = std::clamp<int64_t>(kep[i] - ks, j0, nk);
          if (rel && j1 > j0) {
            const int32_t* ix = ixp + i + N - 1 - ks;  // ix[-j]: the table row of distance i - (ks + j)
            const float* c = (c2p || pp) ? C.data() + a * R : nullptr;
            const float* pm = p2c ? P.data() + ks * R : nullptr;
            // keys at distance >= sat (left) or <= -sat (right) share one table row per side: no lookups
            const int64_t b0 = std::clamp<int64_t>(i - sat + 1 - ks, j0, j1);
            const int64_t b1 = std::clamp<int64_t>(i + sat - ks, b0, j1);
            far_terms(row, j0, b0, c ? c[row_left] : 0.0f, p2c ? far_left.data() + ks : nullptr);
            far_terms(row, b1, j1, c ? c[row_right] : 0.0f, p2c ? far_right.data() + ks : nullptr);
            if (c) {
              for (int64_t j = b0; j < b1; ++j) row[j] += c[ix[-j]];
            }
            if (pm) {
              for (int64_t j = b0; j < b1; ++j) row[j] += pm[j * R + ix[-j]];
            }
          }
          std::fill(row, row + j0, 0.0f);
          softmax_row(row + j0, j1 - j0, mp ? mp + b * N + ks + j0 : nullptr);
          std::fill(row + j1, row + nk, 0.0f);
        }
        gemm(false, bq, Dv, nk, 1.0f, s, nk, vh + ks * Dv, Dv, 0.0f, oh + i0 * Dv, Dv);  // probabilities·v
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "fused disentangled attention at inference: float32, distance i - j");
}
