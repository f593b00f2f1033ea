//! Compiling `kernels.cu` with NVRTC and launching its kernels.

use cudarc::driver::{CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

use super::dev_err;
use crate::error::{EngineError, Result};

/// The kernels' source.
pub(crate) const SOURCE: &str = include_str!("kernels.cu");

/// Compiles the kernels to PTX for compute capability `major.minor` with the options the
/// numeric contract needs: no contraction of multiplies and adds into fused ones (every
/// fused multiply-add in the source is an explicit `fmaf`), IEEE division and square root,
/// denormals kept, no fast math.
pub(crate) fn compile(major: i32, minor: i32) -> Result<Ptx> {
    let opts = CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        use_fast_math: Some(false),
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some("samewise_kernels.cu".into()),
        ..CompileOptions::default()
    };
    compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| EngineError::Device(format!("NVRTC cannot compile the kernels: {e}")))
}

/// One kernel argument.
pub(crate) enum Arg {
    /// A device pointer (0 for none).
    P(u64),
    /// `int`.
    I(i32),
    /// `long long`.
    L(i64),
    /// `float`.
    F(f32),
}

/// The kernels, loaded from the compiled module.
pub(crate) struct Funcs {
    pub gemm_f32: CudaFunction,
    pub gemm_q8: CudaFunction,
    pub gemm_q4: CudaFunction,
    pub gemm_f32_tiled: CudaFunction,
    pub gemm_q8_tiled: CudaFunction,
    pub gemm_q4_tiled: CudaFunction,
    pub rms_norm_rows: CudaFunction,
    pub quantize_q8_rows: CudaFunction,
    pub qkv_post: CudaFunction,
    pub kv_store: CudaFunction,
    pub attention: CudaFunction,
    pub silu_mul: CudaFunction,
    pub add_in_place: CudaFunction,
    pub gather_rows: CudaFunction,
}

impl Funcs {
    pub(crate) fn load(m: &std::sync::Arc<CudaModule>) -> Result<Self> {
        let f = |name: &str| {
            m.load_function(name)
                .map_err(|e| dev_err(&format!("kernel {name}"), e))
        };
        Ok(Self {
            gemm_f32: f("gemm_f32")?,
            gemm_q8: f("gemm_q8")?,
            gemm_q4: f("gemm_q4")?,
            gemm_f32_tiled: f("gemm_f32_tiled")?,
            gemm_q8_tiled: f("gemm_q8_tiled")?,
            gemm_q4_tiled: f("gemm_q4_tiled")?,
            rms_norm_rows: f("rms_norm_rows")?,
            quantize_q8_rows: f("quantize_q8_rows")?,
            qkv_post: f("qkv_post")?,
            kv_store: f("kv_store")?,
            attention: f("attention")?,
            silu_mul: f("silu_mul")?,
            add_in_place: f("add_in_place")?,
            gather_rows: f("gather_rows")?,
        })
    }

    /// Launches `f` on `s` over `grid` blocks of `block` threads with `smem` bytes of dynamic
    /// shared memory.
    pub(crate) fn launch(
        &self,
        s: &CudaStream,
        f: &CudaFunction,
        grid: (usize, usize, usize),
        block: (usize, usize, usize),
        smem: usize,
        args: &[Arg],
    ) -> Result<()> {
        let dim = |v: usize| {
            u32::try_from(v).map_err(|_| EngineError::Device(format!("grid of {v} blocks")))
        };
        let cfg = LaunchConfig {
            grid_dim: (dim(grid.0)?, dim(grid.1)?, dim(grid.2)?),
            block_dim: (dim(block.0)?, dim(block.1)?, dim(block.2)?),
            shared_mem_bytes: dim(smem)?,
        };
        let mut b = s.launch_builder(f);
        for a in args {
            match a {
                Arg::P(v) => b.arg(v),
                Arg::I(v) => b.arg(v),
                Arg::L(v) => b.arg(v),
                Arg::F(v) => b.arg(v),
            };
        }
        // SAFETY: each kernel's argument list above matches its signature in kernels.cu,
        // and every pointer is a live device buffer of the size the kernel reads.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| dev_err("kernel launch", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under CI NVRTC must be present (`.ci/run` installs it from PyPI and puts it on
    /// `LD_LIBRARY_PATH`): these tests are the only check of the kernels' source on a machine
    /// without a GPU, so they fail rather than pass without it.
    fn nvrtc_or_fail() -> bool {
        // SAFETY: only tries to open the library.
        let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
        assert!(
            present || std::env::var_os("CI").is_none(),
            "NVRTC (libnvrtc.so.13) is not on LD_LIBRARY_PATH: scripts/test.sh installs \
             nvidia-cuda-nvrtc from PyPI"
        );
        present
    }

    #[test]
    fn the_kernels_compile_for_every_target_gpu() {
        if !nvrtc_or_fail() {
            return;
        }
        for (major, minor) in [(8, 0), (8, 9), (9, 0)] {
            let ptx = compile(major, minor)
                .unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"))
                .to_src();
            for kernel in [
                "gemm_f32",
                "gemm_q8",
                "gemm_q4",
                "gemm_f32_tiled",
                "gemm_q8_tiled",
                "gemm_q4_tiled",
                "rms_norm_rows",
                "quantize_q8_rows",
                "qkv_post",
                "kv_store",
                "attention",
                "silu_mul",
                "add_in_place",
                "gather_rows",
            ] {
                assert!(
                    ptx.contains(&format!(".entry {kernel}(")),
                    "compute_{major}{minor}: no kernel {kernel} in the PTX"
                );
            }
            assert!(
                ptx.contains(&format!(".target sm_{major}{minor}")),
                "target"
            );
            // no approximate division, square root or transcendental slipped in, and every
            // f32 multiply and add carries an explicit rounding mode: PTX lets ptxas fuse a
            // bare `mul.f32` + `add.f32` pair into an FMA, never a `.rn` one
            for banned in [
                "div.approx",
                "sqrt.approx",
                "ex2.approx",
                ".ftz.",
                "mul.f32",
                "add.f32",
                "sub.f32",
            ] {
                assert!(
                    !ptx.contains(banned),
                    "compute_{major}{minor}: {banned} in the PTX"
                );
            }
            assert!(
                ptx.contains("mul.rn.f32") && ptx.contains("fma.rn.f32"),
                "{ptx}"
            );
        }
    }

    /// The options keep `a * b + c` two rounded operations: the GPU's arithmetic is the
    /// CPU's only if no multiply-add is contracted behind the source's back.
    #[test]
    fn products_and_sums_are_not_contracted() {
        if !nvrtc_or_fail() {
            return;
        }
        let src = "extern \"C\" __global__ void probe(float* y, const float* a) \
                   { y[0] = a[0] * a[1] + a[2]; y[1] = fmaf(a[0], a[1], a[2]); }";
        let opts = |fmad| CompileOptions {
            fmad: Some(fmad),
            options: vec!["--gpu-architecture=compute_90".into()],
            ..CompileOptions::default()
        };
        let ours = compile_ptx_with_opts(src, opts(false))
            .expect("compiles")
            .to_src();
        assert!(ours.contains("mul.rn.f32"), "{ours}");
        assert!(ours.contains("add.rn.f32"), "{ours}");
        assert_eq!(
            ours.matches("fma.rn.f32").count(),
            1,
            "only the explicit fmaf: {ours}"
        );
        // and the check can fail: NVRTC's default contracts the first line too
        let default = compile_ptx_with_opts(src, opts(true))
            .expect("compiles")
            .to_src();
        assert_eq!(default.matches("fma.rn.f32").count(), 2, "{default}");
    }
}
