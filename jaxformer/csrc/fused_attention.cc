// Fused scaled dot-product attention for XLA:CPU, called through the XLA FFI (jax.ffi).
//
// FlashAttention-2's algorithm (Dao 2023) on one CPU thread: the forward walks key tiles of
// kTileKeys with an online softmax and writes the output and the row log-sum-exp; the backward
// recomputes each tile's probabilities from that log-sum-exp and accumulates dq, dk, dv. The
// largest scratch array is one tile of scores (kTileRows x kTileKeys), never T x S.
//
// Layouts (row-major, fp32): q [B, T, H, D]; k, v [B, S, K, D] with H % K == 0 (query head h
// uses key/value head h / (H / K)); out [B, T, H, D]; lse [B, H, T]. Query i sits at position
// i + q_offset; with causal, key j is visible when j <= i + q_offset (q_offset >= 0, so every
// row sees key 0 and no row is empty).
//
// Inner loops use GCC/Clang vector extensions (8 floats, one AVX register) over contiguous
// head-dimension or key-tile rows; head dims are zero-padded to 8, 16, 32, 48, 64, 96 or 128 when packed.
// Rows per register block are sized to the vector registers the build has (16 with AVX2, 32 with
// AVX-512), and causal blocks skip the half-tiles of keys no row of theirs sees.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#if defined(__FMA__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

constexpr int kTileKeys = 64;  // keys per tile: 8 vectors of scores per query row
constexpr int kTileRows = 32;  // query rows per block
constexpr int kTileVecs = kTileKeys / 8;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// vector registers the compiler may allocate: AVX-512 (VL) gives 32 for 8-float vectors too, AVX2 16
#if defined(__AVX512F__)
constexpr int kRegisters = 32;
#else
constexpr int kRegisters = 16;
#endif

// scratch buffers aligned to cache lines, so that no 32-byte load straddles two lines
template <typename T>
struct CacheAligned {
  using value_type = T;
  CacheAligned() = default;
  template <typename U>
  CacheAligned(const CacheAligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t{64}); }
  bool operator==(const CacheAligned&) const { return true; }
  bool operator!=(const CacheAligned&) const { return false; }
};
using Scratch = std::vector<float, CacheAligned<float>>;

inline v8 load8(const float* p) {
  v8 x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}
inline void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof(x)); }
inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }

// a·b + c, rounded once where the CPU has FMA. The score dots and the backward's Δ both use it, so that they
// round alike whatever the compiler would contract (see `backward`).
inline v8 fmadd8(v8 a, v8 b, v8 c) {
#if defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// exp(x), Cephes' single-precision polynomial on x - n·ln 2; inputs are clamped to [-86, 88]
// (exp(-86) ~ 4e-38: masked entries are zeroed by the callers, not by underflow).
inline v8 exp8(v8 x) {
  const v8 hi = splat(88.0f), lo = splat(-86.0f);
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const v8 magic = splat(12582912.0f);  // 1.5·2^23: adding it rounds to the nearest integer
  v8 t = x * splat(1.44269504088896341f) + magic;
  v8 n = t - magic;
  v8i ni;
  std::memcpy(&ni, &t, sizeof(ni));
  v8i magic_bits;
  std::memcpy(&magic_bits, &magic, sizeof(magic_bits));
  ni = ni - magic_bits;
  v8 r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  v8 y = splat(1.9875691500e-4f);
  y = y * r + splat(1.3981999507e-3f);
  y = y * r + splat(8.3334519073e-3f);
  y = y * r + splat(4.1665795894e-2f);
  y = y * r + splat(1.6666665459e-1f);
  y = y * r + splat(5.0000001201e-1f);
  y = y * (r * r) + r + splat(1.0f);
  v8i bits;
  std::memcpy(&bits, &y, sizeof(bits));
  bits = bits + (ni << 23);
  std::memcpy(&y, &bits, sizeof(y));
  return y;
}

// x with the lanes of vector c of a key row (keys 8c .. 8c + 7) at or past `valid` replaced by `fill`
inline v8 masked(v8 x, int c, int64_t valid, v8 fill) {
  if (8 * c + 8 <= valid) return x;
  const v8i key = v8i{0, 1, 2, 3, 4, 5, 6, 7} + 8 * c;
  const v8i limit = v8i{0, 0, 0, 0, 0, 0, 0, 0} + static_cast<int32_t>(valid);
  return key < limit ? x : fill;
}

inline float hmax8(v8 x) {
  float m = x[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, x[i]);
  return m;
}
inline float hsum8(v8 x) {
  return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

// out[r, 0:32·halves] = a[r·lda, 0:8·NV] · Mt[:, 0:32·halves] for R rows of a (stride lda) and of out
// (stride kTileKeys), Mt being 8·NV rows of ldm floats (the tile's first column). Each load of Mt serves
// all R rows (R FMAs per load). The tile is done in halves of 32 keys, so that the R x 4 accumulators and
// 4 loaded vectors fit in the vector registers, and a causal block whose keys end within the first half
// computes only that half.
template <int NV, int R>
inline void tile_dots_rows(const float* a, int64_t lda, const float* Mt, int64_t ldm, int halves, float* out) {
  constexpr int kHalf = kTileVecs / 2;
  for (int h = 0; h < halves; ++h) {
    v8 acc[R][kHalf];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kHalf; ++c) acc[r][c] = splat(0.0f);
    for (int d = 0; d < 8 * NV; ++d) {
      const float* row = Mt + d * ldm + 8 * kHalf * h;
      v8 m[kHalf];
      for (int c = 0; c < kHalf; ++c) m[c] = load8(row + 8 * c);
      for (int r = 0; r < R; ++r) {
        const float ar = a[r * lda + d];
        for (int c = 0; c < kHalf; ++c) acc[r][c] = fmadd8(splat(ar), m[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kHalf; ++c) store8(out + r * kTileKeys + 8 * (kHalf * h + c), acc[r][c]);
  }
}

// rows [0, nr) of the score tile's first 32·halves keys, kScoreRows rows at a time
constexpr int kScoreRows = kRegisters >= 32 ? 4 : 2;
template <int NV>
inline void tile_rows(const float* a, int64_t lda, const float* Mt, int64_t ldm, int nr, int halves, float* out) {
  int r = 0;
  for (; r + kScoreRows <= nr; r += kScoreRows)
    tile_dots_rows<NV, kScoreRows>(a + r * lda, lda, Mt, ldm, halves, out + r * kTileKeys);
  for (; r < nr; ++r) tile_dots_rows<NV, 1>(a + r * lda, lda, Mt, ldm, halves, out + r * kTileKeys);
}

// 32-key halves of a tile that hold the first nk keys
inline int halves_for(int nk) { return nk > kTileKeys / 2 ? 2 : 1; }

constexpr int pow2_floor(int n) { return n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1; }

// C[r, :] += Σ_s coef[r·cs_row + s·cs_sum] · X[s, :] for r < nrows, s < nsum; rows of 8·NV floats,
// C and X with leading dimensions ldc and ldx. R rows share each load of X.
template <int NV>
void accumulate(float* C, int64_t ldc, const float* coef, int64_t cs_row, int64_t cs_sum, const float* X,
                int64_t ldx, int nrows, int nsum) {
  // R accumulator rows of NV vectors plus the NV loaded ones within the registers (pow2_floor caps R at 8)
  constexpr int R = pow2_floor(std::max(1, (kRegisters - 4) / NV - 1));
  int r0 = 0;
  for (; r0 + R <= nrows; r0 += R) {
    v8 acc[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) acc[r][v] = load8(C + (r0 + r) * ldc + 8 * v);
    for (int s = 0; s < nsum; ++s) {
      const float* x = X + s * ldx;
      v8 xs[NV];
      for (int v = 0; v < NV; ++v) xs[v] = load8(x + 8 * v);
      for (int r = 0; r < R; ++r) {
        const float c = coef[(r0 + r) * cs_row + s * cs_sum];
        for (int v = 0; v < NV; ++v) acc[r][v] += c * xs[v];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) store8(C + (r0 + r) * ldc + 8 * v, acc[r][v]);
  }
  for (; r0 < nrows; ++r0) {
    v8 acc[NV];
    for (int v = 0; v < NV; ++v) acc[v] = load8(C + r0 * ldc + 8 * v);
    for (int s = 0; s < nsum; ++s) {
      const float c = coef[r0 * cs_row + s * cs_sum];
      for (int v = 0; v < NV; ++v) acc[v] += c * load8(X + s * ldx + 8 * v);
    }
    for (int v = 0; v < NV; ++v) store8(C + r0 * ldc + 8 * v, acc[v]);
  }
}

struct Shape {
  int64_t B, T, S, H, K, D;
  float scale;
  bool causal;
  int64_t q_offset;
  int64_t G() const { return H / K; }
  // head dim padded to a vector count the kernels are compiled for: 1, 2, 4, 6, 8, 12 or 16 vectors of 8
  int64_t Dp() const {
    const int64_t vectors = (D + 7) / 8;
    for (int64_t nv : {1, 2, 4, 6, 8, 12, 16})
      if (vectors <= nv) return 8 * nv;
    return 8 * vectors;
  }
  int64_t Sp() const { return (S + kTileKeys - 1) / kTileKeys * kTileKeys; }
  // keys visible to query row i: a prefix [0, visible(i))
  int64_t visible(int64_t i) const { return causal ? std::min(S, i + q_offset + 1) : S; }
};

// rows [b, :, head, :] of a [B, N, heads, D] array into a zero-padded [N, Dp] buffer, times mult
void pack_rows(const float* src, const Shape& s, int64_t N, int64_t heads, int64_t b, int64_t head, float mult,
               float* dst) {
  const int64_t Dp = s.Dp();
  for (int64_t n = 0; n < N; ++n) {
    const float* row = src + ((b * N + n) * heads + head) * s.D;
    float* out = dst + n * Dp;
    for (int64_t d = 0; d < s.D; ++d) out[d] = row[d] * mult;
    for (int64_t d = s.D; d < Dp; ++d) out[d] = 0.0f;
  }
}

// the transpose of the same rows: [Dp, Sp], zero-padded in both directions
void pack_cols(const float* src, const Shape& s, int64_t b, int64_t head, float* dst) {
  const int64_t Dp = s.Dp(), Sp = s.Sp(), stride = s.K * s.D;
  const float* base = src + (b * s.S * s.K + head) * s.D;
  for (int64_t d = 0; d < s.D; ++d) {  // contiguous writes, strided reads
    float* out = dst + d * Sp;
    for (int64_t n = 0; n < s.S; ++n) out[n] = base[n * stride + d];
    std::fill(out + s.S, out + Sp, 0.0f);
  }
  std::fill(dst + s.D * Sp, dst + Dp * Sp, 0.0f);
}

void unpack_rows(const float* src, const Shape& s, int64_t N, int64_t heads, int64_t b, int64_t head, float mult,
                 float* dst) {
  const int64_t Dp = s.Dp();
  for (int64_t n = 0; n < N; ++n) {
    float* row = dst + ((b * N + n) * heads + head) * s.D;
    for (int64_t d = 0; d < s.D; ++d) row[d] = src[n * Dp + d] * mult;
  }
}

template <int NV>
void forward(const Shape& s, const float* q, const float* k, const float* v, float* out, float* lse) {
  const int64_t Dp = s.Dp(), Sp = s.Sp(), G = s.G();
  Scratch Kt(Dp * Sp), V(Sp * Dp, 0.0f), Q(s.T * Dp);
  Scratch O(kTileRows * Dp), P(kTileRows * kTileKeys), m(kTileRows), l(kTileRows), O_all(s.T * Dp);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t kh = 0; kh < s.K; ++kh) {
      pack_cols(k, s, b, kh, Kt.data());
      pack_rows(v, s, s.S, s.K, b, kh, 1.0f, V.data());
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = kh * G + g;
        pack_rows(q, s, s.T, s.H, b, h, s.scale, Q.data());
        float* lse_row = lse + (b * s.H + h) * s.T;
        for (int64_t i0 = 0; i0 < s.T; i0 += kTileRows) {
          const int nr = static_cast<int>(std::min<int64_t>(kTileRows, s.T - i0));
          std::fill(O.begin(), O.end(), 0.0f);
          std::fill(m.begin(), m.end(), kNegInf);
          std::fill(l.begin(), l.end(), 0.0f);
          const int64_t key_end = s.visible(i0 + nr - 1);
          for (int64_t j0 = 0; j0 < key_end; j0 += kTileKeys) {
            const int nk = static_cast<int>(std::min<int64_t>(kTileKeys, key_end - j0));
            const int halves = halves_for(nk), vecs = halves * kTileVecs / 2;
            tile_rows<NV>(Q.data() + i0 * Dp, Dp, Kt.data() + j0, Sp, nr, halves, P.data());
            for (int r = 0; r < nr; ++r) {
              float* p = P.data() + r * kTileKeys;
              const int64_t valid = std::min<int64_t>(kTileKeys, s.visible(i0 + r) - j0);
              if (valid <= 0) {
                std::fill(p, p + kTileKeys, 0.0f);
                continue;
              }
              // the row's scores stay in registers; keys at or past `valid` are masked (-inf, then 0)
              v8 x[kTileVecs];
              for (int c = 0; c < vecs; ++c) x[c] = masked(load8(p + 8 * c), c, valid, splat(kNegInf));
              v8 mx = x[0];
              for (int c = 1; c < vecs; ++c) mx = mx > x[c] ? mx : x[c];
              const float m_new = std::max(m[r], hmax8(mx));
              const float alpha = std::exp(m[r] - m_new);  // exp(-inf) = 0 on the first tile
              v8 sum = splat(0.0f);
              for (int c = 0; c < vecs; ++c) {
                const v8 e = masked(exp8(x[c] - splat(m_new)), c, valid, splat(0.0f));
                store8(p + 8 * c, e);
                sum += e;
              }
              l[r] = l[r] * alpha + hsum8(sum);
              m[r] = m_new;
              if (alpha != 1.0f) {
                float* o = O.data() + r * Dp;
                for (int64_t d = 0; d < Dp; ++d) o[d] *= alpha;
              }
            }
            accumulate<NV>(O.data(), Dp, P.data(), kTileKeys, 1, V.data() + j0 * Dp, Dp, nr, nk);
          }
          for (int r = 0; r < nr; ++r) {
            const float inv = 1.0f / l[r];
            float* dst = O_all.data() + (i0 + r) * Dp;
            for (int64_t d = 0; d < Dp; ++d) dst[d] = O[r * Dp + d] * inv;
            lse_row[i0 + r] = m[r] + std::log(l[r]);
          }
        }
        unpack_rows(O_all.data(), s, s.T, s.H, b, h, 1.0f, out);
      }
    }
  }
}

template <int NV>
void backward(const Shape& s, const float* q, const float* k, const float* v, const float* out, const float* dout,
              const float* lse, float* dq, float* dk, float* dv) {
  const int64_t Dp = s.Dp(), Sp = s.Sp(), G = s.G(), T = s.T;
  Scratch Kt(Dp * Sp), Vt(Dp * Sp), Krows(Sp * Dp, 0.0f);
  Scratch Q(G * T * Dp), dO(G * T * Dp), dQ(G * T * Dp), delta(G * T);
  Scratch dK(Sp * Dp), dV(Sp * Dp), P(kTileRows * kTileKeys), dS(kTileRows * kTileKeys);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t kh = 0; kh < s.K; ++kh) {
      pack_cols(k, s, b, kh, Kt.data());
      pack_cols(v, s, b, kh, Vt.data());
      pack_rows(k, s, s.S, s.K, b, kh, 1.0f, Krows.data());
      for (int64_t g = 0; g < G; ++g) {
        const int64_t h = kh * G + g;
        pack_rows(q, s, T, s.H, b, h, s.scale, Q.data() + g * T * Dp);
        pack_rows(dout, s, T, s.H, b, h, 1.0f, dO.data() + g * T * Dp);
        // Δ_i = Σ_d dO_id·O_id, summed as `tile_dots_rows` sums dP_ij = Σ_d dO_id·V_jd (same order, same
        // multiply-adds): where the softmax saturates (O_i = V_j, P_ij = 1) dP_ij - Δ_i is exactly 0, as the
        // reference's softmax gradient gives, not a rounding error that the scale multiplies into dq and dk
        for (int64_t i = 0; i < T; ++i) {
          const float* o = out + ((b * T + i) * s.H + h) * s.D;
          const float* g_row = dout + ((b * T + i) * s.H + h) * s.D;
          v8 acc = splat(0.0f);
          for (int64_t d = 0; d < s.D; ++d) acc = fmadd8(splat(g_row[d]), splat(o[d]), acc);
          delta[g * T + i] = acc[0];
        }
      }
      std::fill(dQ.begin(), dQ.end(), 0.0f);
      std::fill(dK.begin(), dK.end(), 0.0f);
      std::fill(dV.begin(), dV.end(), 0.0f);
      for (int64_t j0 = 0; j0 < s.S; j0 += kTileKeys) {
        const int nk = static_cast<int>(std::min<int64_t>(kTileKeys, s.S - j0));
        // the first query that sees key j0
        const int64_t i_start = s.causal ? std::max<int64_t>(0, j0 - s.q_offset) : 0;
        for (int64_t g = 0; g < G; ++g) {
          const int64_t h = kh * G + g;
          const float* lse_row = lse + (b * s.H + h) * T;
          const float* Qg = Q.data() + g * T * Dp;
          const float* dOg = dO.data() + g * T * Dp;
          for (int64_t i0 = i_start; i0 < T; i0 += kTileRows) {
            const int nr = static_cast<int>(std::min<int64_t>(kTileRows, T - i0));
            // keys of this tile that some row of the block sees (causal blocks on the diagonal see fewer)
            const int nk_seen = static_cast<int>(std::min<int64_t>(nk, s.visible(i0 + nr - 1) - j0));
            const int halves = halves_for(nk_seen), vecs = halves * kTileVecs / 2;
            tile_rows<NV>(Qg + i0 * Dp, Dp, Kt.data() + j0, Sp, nr, halves, P.data());
            tile_rows<NV>(dOg + i0 * Dp, Dp, Vt.data() + j0, Sp, nr, halves, dS.data());
            for (int r = 0; r < nr; ++r) {
              const int64_t i = i0 + r;
              float* p = P.data() + r * kTileKeys;
              float* ds = dS.data() + r * kTileKeys;
              const int64_t valid = std::min<int64_t>(kTileKeys, s.visible(i) - j0);
              if (valid <= 0) {
                std::fill(p, p + kTileKeys, 0.0f);
                std::fill(ds, ds + kTileKeys, 0.0f);
                continue;
              }
              const v8 lse_i = splat(lse_row[i]), delta_i = splat(delta[g * T + i]);
              for (int c = 0; c < vecs; ++c) {
                v8 e = exp8(load8(p + 8 * c) - lse_i);
                store8(p + 8 * c, e);
              }
              for (int64_t j = valid; j < kTileKeys; ++j) p[j] = 0.0f;
              for (int c = 0; c < vecs; ++c) {
                store8(ds + 8 * c, load8(p + 8 * c) * (load8(ds + 8 * c) - delta_i));
              }
            }
            // dV_j += Σ_i P_ij dO_i; dK_j += Σ_i dS_ij Q_i (Q already scaled); dQ_i += Σ_j dS_ij K_j
            accumulate<NV>(dV.data() + j0 * Dp, Dp, P.data(), 1, kTileKeys, dOg + i0 * Dp, Dp, nk_seen, nr);
            accumulate<NV>(dK.data() + j0 * Dp, Dp, dS.data(), 1, kTileKeys, Qg + i0 * Dp, Dp, nk_seen, nr);
            accumulate<NV>(dQ.data() + (g * T + i0) * Dp, Dp, dS.data(), kTileKeys, 1, Krows.data() + j0 * Dp, Dp,
                           nr, nk_seen);
          }
        }
      }
      for (int64_t g = 0; g < G; ++g)
        unpack_rows(dQ.data() + g * T * Dp, s, T, s.H, b, kh * G + g, s.scale, dq);
      unpack_rows(dK.data(), s, s.S, s.K, b, kh, 1.0f, dk);
      unpack_rows(dV.data(), s, s.S, s.K, b, kh, 1.0f, dv);
    }
  }
}

constexpr int64_t kMaxHeadDim = 128;

template <template <int> class F, typename... Args>
bool dispatch_nv(int64_t nv, Args&&... args) {
  switch (nv) {
#define JAXFORMER_CASE(n) \
  case n:                 \
    F<n>::run(args...);   \
    return true;
    JAXFORMER_CASE(1) JAXFORMER_CASE(2) JAXFORMER_CASE(4) JAXFORMER_CASE(6) JAXFORMER_CASE(8) JAXFORMER_CASE(12)
    JAXFORMER_CASE(16)
#undef JAXFORMER_CASE
    default:
      return false;
  }
}

template <int NV>
struct Forward {
  template <typename... Args>
  static void run(Args... args) { forward<NV>(args...); }
};
template <int NV>
struct Backward {
  template <typename... Args>
  static void run(Args... args) { backward<NV>(args...); }
};

ffi::Error make_shape(ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& k, ffi::Buffer<ffi::F32>& v, float scale,
                      int64_t causal, int64_t q_offset, Shape* s) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return ffi::Error::InvalidArgument("fused attention: q, k, v must have rank 4");
  *s = Shape{qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], scale, causal != 0, q_offset};
  for (int i = 0; i < 4; ++i)
    if (kd[i] != vd[i]) return ffi::Error::InvalidArgument("fused attention: k and v shapes differ");
  if (kd[0] != s->B || kd[3] != s->D) return ffi::Error::InvalidArgument("fused attention: q and k disagree");
  if (s->K <= 0 || s->H % s->K != 0)
    return ffi::Error::InvalidArgument("fused attention: query heads must be a multiple of key heads");
  if (s->D > kMaxHeadDim) return ffi::Error::InvalidArgument("fused attention: head_dim above 128");
  if (s->q_offset < 0) return ffi::Error::InvalidArgument("fused attention: negative q_offset");
  return ffi::Error::Success();
}

ffi::Error AttentionForwardImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                                ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse, float scale,
                                int64_t causal, int64_t q_offset) {
  Shape s;
  ffi::Error error = make_shape(q, k, v, scale, causal, q_offset, &s);
  if (error.failure()) return error;
  if (s.B * s.T * s.H == 0) return ffi::Error::Success();
  if (s.S == 0) return ffi::Error::InvalidArgument("fused attention: no keys");
  if (!dispatch_nv<Forward>(s.Dp() / 8, s, q.typed_data(), k.typed_data(), v.typed_data(), out->typed_data(),
                       lse->typed_data()))
    return ffi::Error::InvalidArgument("fused attention: unsupported head_dim");
  return ffi::Error::Success();
}

ffi::Error AttentionBackwardImpl(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                                 ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> dout, ffi::Buffer<ffi::F32> lse,
                                 ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk,
                                 ffi::ResultBuffer<ffi::F32> dv, float scale, int64_t causal, int64_t q_offset) {
  Shape s;
  ffi::Error error = make_shape(q, k, v, scale, causal, q_offset, &s);
  if (error.failure()) return error;
  if (s.B * s.T * s.H == 0 || s.S == 0) {
    std::fill(dk->typed_data(), dk->typed_data() + dk->element_count(), 0.0f);
    std::fill(dv->typed_data(), dv->typed_data() + dv->element_count(), 0.0f);
    std::fill(dq->typed_data(), dq->typed_data() + dq->element_count(), 0.0f);
    return ffi::Error::Success();
  }
  if (!dispatch_nv<Backward>(s.Dp() / 8, s, q.typed_data(), k.typed_data(), v.typed_data(), out.typed_data(),
                        dout.typed_data(), lse.typed_data(), dq->typed_data(), dk->typed_data(), dv->typed_data()))
    return ffi::Error::InvalidArgument("fused attention: unsupported head_dim");
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxformerAttentionForward, AttentionForwardImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Ret<ffi::Buffer<ffi::F32>>()  // out
                                  .Ret<ffi::Buffer<ffi::F32>>()  // lse
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("causal")
                                  .Attr<int64_t>("q_offset"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxformerAttentionBackward, AttentionBackwardImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // out
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dout
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lse
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dq
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dk
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dv
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("causal")
                                  .Attr<int64_t>("q_offset"));

// the ABI version of this source, checked by the Python loader
extern "C" int jaxformer_fused_attention_version() { return 1; }
