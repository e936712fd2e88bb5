// A bf16 or fp32 matmul for XLA:CPU through oneDNN's matmul primitive, called through the XLA FFI (jax.ffi).
//
// c[M, N] = op(a) · op(b) with bf16 operands and fp32 accumulation, or fp32 operands and result,
// where op(a) is a [M, K] or, with trans_a, the transpose of a [K, M] buffer (likewise b: [K, N], or [N, K] with trans_b).
// The transposes are strides in oneDNN's memory descriptors, so the backward pass's x^T·dy and
// dy·w^T read their operands where they lie. bf16 operands give a bf16 or fp32 result (the result
// buffer's type); fp32 operands an fp32 one.
//
// oneDNN picks its kernel for the CPU it runs on (AVX512_BF16 dot products, AMX tiles), which
// XLA:CPU's own bf16 dot does not reach; in fp32 its AVX-512 kernels beat XLA:CPU's dot on some
// shapes. Primitives are built once per calling thread, shape, transposes, operand and result types
// and thread count, and kept: building one JIT-compiles its kernel.
//
// Threads: oneDNN's OpenMP runtime runs each call on `threads` threads of the calling thread's
// team. The Python side passes 1: with more, the sums' order varied between calls (not deterministic).

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

#include "oneapi/dnnl/dnnl.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int64_t>;  // M K N ta tb src dst threads

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

struct Built {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
};

// One cache per calling thread: oneDNN 3.2 serialises concurrent executions of one primitive object (two
// devices' calls of the same shape took twice one call's time), so each XLA thread keeps its own.
const Built& primitive(const Key& key) {
  thread_local std::map<Key, Built> built;
  auto found = built.find(key);
  if (found != built.end()) return found->second;
  auto [M, K, N, trans_a, trans_b, src_f32, dst_f32, threads] = key;
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  const dt src = src_f32 ? dt::f32 : dt::bf16;
  md a({M, K}, src, trans_a ? dnnl::memory::dims{1, M} : dnnl::memory::dims{K, 1});
  md b({K, N}, src, trans_b ? dnnl::memory::dims{1, K} : dnnl::memory::dims{N, 1});
  md c({M, N}, dst_f32 ? dt::f32 : dt::bf16, dnnl::memory::dims{N, 1});
  dnnl::matmul::primitive_desc pd(cpu_engine(), a, b, c);
  return built.emplace(key, Built{pd, dnnl::matmul(pd)}).first->second;
}

ffi::Error MatmulImpl(ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> c,
                      int64_t trans_a, int64_t trans_b, int64_t threads) {
  auto ad = a.dimensions();
  auto bd = b.dimensions();
  auto cd = c->dimensions();
  if (ad.size() != 2 || bd.size() != 2 || cd.size() != 2)
    return ffi::Error::InvalidArgument("onednn matmul: operands and result must be 2-D");
  const int64_t M = trans_a ? ad[1] : ad[0], K = trans_a ? ad[0] : ad[1];
  const int64_t N = trans_b ? bd[0] : bd[1], Kb = trans_b ? bd[1] : bd[0];
  if (K != Kb || cd[0] != M || cd[1] != N)
    return ffi::Error::InvalidArgument("onednn matmul: shapes do not match");
  const bool src_f32 = a.element_type() == ffi::DataType::F32;
  if (b.element_type() != a.element_type() || (!src_f32 && a.element_type() != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument("onednn matmul: the operands must be both bf16 or both fp32");
  const bool f32 = c->element_type() == ffi::DataType::F32;
  if (!f32 && (src_f32 || c->element_type() != ffi::DataType::BF16))
    return ffi::Error::InvalidArgument("onednn matmul: the result must be fp32, or bf16 from bf16 operands");
  if (M == 0 || N == 0) return ffi::Error::Success();
  if (K == 0) {  // an empty sum
    std::memset(c->untyped_data(), 0, c->size_bytes());
    return ffi::Error::Success();
  }
  omp_set_num_threads(static_cast<int>(threads));
  try {
    const Built& built = primitive(Key{M, K, N, trans_a, trans_b, src_f32, f32, threads});
    dnnl::memory am(built.pd.src_desc(), cpu_engine(), a.untyped_data());
    dnnl::memory bm(built.pd.weights_desc(), cpu_engine(), b.untyped_data());
    dnnl::memory cm(built.pd.dst_desc(), cpu_engine(), c->untyped_data());
    dnnl::stream stream(cpu_engine());
    built.matmul.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  } catch (const dnnl::error& error) {
    return ffi::Error::Internal(std::string("onednn matmul: ") + error.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxformerOnednnMatmul, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // a: bf16 or fp32
                                  .Arg<ffi::AnyBuffer>()  // b: a's type
                                  .Ret<ffi::AnyBuffer>()  // c: bf16 or fp32
                                  .Attr<int64_t>("trans_a")
                                  .Attr<int64_t>("trans_b")
                                  .Attr<int64_t>("threads"));

// Whether oneDNN has a matmul for these operand and result types on this CPU (its bf16 kernels need bf16-capable
// instructions, e.g. AVX512_CORE; on an AVX2-only CPU no primitive exists). Probed once by the Python loader.
extern "C" int jaxformer_onednn_matmul_supports(int src_f32, int dst_f32) {
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  const dt src = src_f32 ? dt::f32 : dt::bf16;
  try {
    dnnl::matmul::primitive_desc pd(cpu_engine(), md({8, 8}, src, dnnl::memory::format_tag::ab),
                                    md({8, 8}, src, dnnl::memory::format_tag::ab),
                                    md({8, 8}, dst_f32 ? dt::f32 : dt::bf16, dnnl::memory::format_tag::ab));
    return 1;
  } catch (const dnnl::error&) {
    return 0;
  }
}

// the ABI version of this source, checked by the Python loader
extern "C" int jaxformer_onednn_matmul_version() { return 4; }
