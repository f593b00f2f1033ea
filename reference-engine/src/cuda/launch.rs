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
///
/// NVRTC runs once per compute capability and process: later engines (a server loading a
/// model per profile, the GPU check's many engines) reuse the PTX.
pub(crate) fn compile(major: i32, minor: i32) -> Result<Ptx> {
    static CACHE: std::sync::Mutex<Vec<((i32, i32), String)>> = std::sync::Mutex::new(Vec::new());
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, src)) = cache.iter().find(|(cc, _)| *cc == (major, minor)) {
        return Ok(Ptx::from_src(src.clone()));
    }
    let ptx = compile_uncached(major, minor)?;
    cache.push(((major, minor), ptx.to_src()));
    Ok(ptx)
}

fn compile_uncached(major: i32, minor: i32) -> Result<Ptx> {
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

/// The GEMM kernels: each computes every output as one fmaf chain over k in order from
/// zero, so all give the same bits; they differ in how many outputs a block and a thread
/// take (see `kernels.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmKind {
    /// 16 x 16 outputs a block, one a thread.
    Simple,
    /// 64 x 64 a block, 4 x 4 a thread.
    Tiled,
    /// 128 x 128 a block, 8 x 8 a thread, operands fetched a tile ahead; two blocks a
    /// multiprocessor (`Wide`) or one with more registers (`Wide1`).
    Wide,
    Wide1,
    /// 1, 4 or 16 rows x 64 columns a block, one column a thread, weights staged with
    /// cp.async (when the stage length divides k).
    Skinny1,
    Skinny4,
    Skinny16,
}

/// What the choice of a GEMM kernel depends on: the weight's output columns, input length,
/// format (0 f32, 1 eight-bit, 2 four-bit) and quantization group (0 for f32).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GemmShape {
    pub n: usize,
    pub k: usize,
    pub fmt: u8,
    pub group: usize,
}

impl GemmKind {
    /// `SAMEWISE_CUDA_GEMM=simple|tiled|wide|wide1|skinny` forces a kernel (every kind
    /// computes each output as the same fmaf chain, so all give the same bits; the GPU
    /// check compares them); unset or `auto`, [`GemmKind::choose`] picks.
    pub(crate) fn from_env() -> Result<Option<Self>> {
        Self::parse(std::env::var("SAMEWISE_CUDA_GEMM").ok().as_deref())
    }

    fn parse(v: Option<&str>) -> Result<Option<Self>> {
        match v {
            None | Some("" | "auto") => Ok(None),
            Some("simple") => Ok(Some(Self::Simple)),
            Some("tiled") => Ok(Some(Self::Tiled)),
            Some("wide") => Ok(Some(Self::Wide)),
            Some("wide1") => Ok(Some(Self::Wide1)),
            Some("skinny") => Ok(Some(Self::Skinny16)),
            Some(other) => Err(EngineError::Device(format!(
                "SAMEWISE_CUDA_GEMM={other}: expected auto, simple, tiled, wide, wide1 or skinny"
            ))),
        }
    }

    /// The kernel for `m` rows of a weight of shape `w` on `sms` multiprocessors, `forced`
    /// if it can run the shape (else the 64 x 64 tiles, which run any). Up to 64 rows the
    /// skinny kernels (one thread a column, the weights streamed once per 16 rows); beyond,
    /// the 128 x 128 tiles, two blocks a multiprocessor, or one with more registers when
    /// the grid is at most one block a multiprocessor. As measured on an H200
    /// (`scripts/gpu-check.sh`, Llama 1B and 8B shapes, 4-bit weights): at 64 rows the
    /// skinny kernel takes a fifth to three fifths of the others' time; at 512 and 2,048
    /// rows the 128 x 128 tiles take 0.35-0.8 of the 64 x 64 tiles' time, the one-block
    /// variant 5-12% less than the two-block one on grids of at most 132 blocks and 8-27%
    /// more on larger ones.
    pub(crate) fn choose(forced: Option<Self>, m: usize, w: GemmShape, sms: usize) -> Self {
        let skinny_ok = w.k.is_multiple_of(Self::SKINNY_STAGE)
            && (w.fmt == 0 || matches!(w.group, 16 | 32 | 64));
        let wide_ok = w.k.is_multiple_of(Self::WIDE_TILE)
            && (w.fmt == 0 || (w.group > 0 && w.group.is_multiple_of(Self::WIDE_TILE)));
        let skinny = match m {
            1 => Self::Skinny1,
            2..=4 => Self::Skinny4,
            _ => Self::Skinny16,
        };
        match forced {
            Some(Self::Skinny1 | Self::Skinny4 | Self::Skinny16) if skinny_ok => skinny,
            Some(Self::Wide | Self::Wide1) if !wide_ok => Self::Tiled,
            Some(Self::Skinny1 | Self::Skinny4 | Self::Skinny16) => Self::Tiled,
            Some(k) => k,
            None if m <= 64 && skinny_ok => skinny,
            None if m < 32 => Self::Simple,
            None if wide_ok && w.n.div_ceil(128) * m.div_ceil(128) <= sms => Self::Wide1,
            None if wide_ok => Self::Wide,
            None => Self::Tiled,
        }
    }

    pub(crate) const ALL: [Self; 7] = [
        Self::Simple,
        Self::Tiled,
        Self::Wide,
        Self::Wide1,
        Self::Skinny1,
        Self::Skinny4,
        Self::Skinny16,
    ];

    /// The kernel name's suffix.
    fn suffix(self) -> &'static str {
        match self {
            Self::Simple => "",
            Self::Tiled => "_tiled",
            Self::Wide => "_wide",
            Self::Wide1 => "_wide1",
            Self::Skinny1 => "_skinny1",
            Self::Skinny4 => "_skinny4",
            Self::Skinny16 => "_skinny16",
        }
    }

    /// Output rows and columns one block computes.
    pub(crate) fn block_tile(self) -> (usize, usize) {
        match self {
            Self::Simple => (16, 16),
            Self::Tiled => (64, 64),
            Self::Wide | Self::Wide1 => (128, 128),
            Self::Skinny1 => (1, 64),
            Self::Skinny4 => (4, 64),
            Self::Skinny16 => (16, 64),
        }
    }

    /// Threads per block.
    pub(crate) fn block_dim(self) -> (usize, usize, usize) {
        match self {
            Self::Simple | Self::Tiled | Self::Wide | Self::Wide1 => (16, 16, 1),
            Self::Skinny1 | Self::Skinny4 | Self::Skinny16 => (64, 1, 1),
        }
    }

    /// k values one skinny kernel's stage copies (it needs k a multiple of this).
    pub(crate) const SKINNY_STAGE: usize = 64;
    /// k values one wide kernel's tile holds (it needs k and the group multiples of this).
    pub(crate) const WIDE_TILE: usize = 8;
}

/// Weight formats, as the kernels' names spell them (index = `DevLinear::fmt`).
const FORMATS: [&str; 3] = ["f32", "q8", "q4"];

/// Every kernel name in the module (the GEMMs by format and kind, then the rest).
#[cfg(test)]
fn kernel_names() -> Vec<String> {
    let mut names: Vec<String> = GemmKind::ALL
        .iter()
        .flat_map(|k| {
            FORMATS
                .iter()
                .map(move |f| format!("gemm_{f}{}", k.suffix()))
        })
        .collect();
    names.extend(
        [
            "rms_norm_rows",
            "quantize_q8_rows",
            "qkv_post",
            "kv_store",
            "attention",
            "silu_mul",
            "add_in_place",
            "gather_rows",
        ]
        .map(String::from),
    );
    names
}

/// The kernels, loaded from the compiled module.
pub(crate) struct Funcs {
    /// `[kind][format]`, in [`GemmKind::ALL`] and [`FORMATS`] order.
    gemm: Vec<[CudaFunction; 3]>,
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
        let mut gemm = Vec::with_capacity(GemmKind::ALL.len());
        for kind in GemmKind::ALL {
            let g = |fmt: &str| f(&format!("gemm_{fmt}{}", kind.suffix()));
            gemm.push([g(FORMATS[0])?, g(FORMATS[1])?, g(FORMATS[2])?]);
        }
        Ok(Self {
            gemm,
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

    /// The GEMM kernel of `kind` for weight format `fmt` (0 f32, 1 eight-bit, 2 four-bit).
    pub(crate) fn gemm(&self, kind: GemmKind, fmt: u8) -> &CudaFunction {
        let i = GemmKind::ALL.iter().position(|&k| k == kind).unwrap_or(0);
        &self.gemm[i][usize::from(fmt.min(2))]
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
            for kernel in kernel_names() {
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

    #[test]
    fn the_gemm_kernel_follows_the_rows_the_shape_and_the_override() {
        let sms = 132;
        let q4 = |n, k| GemmShape {
            n,
            k,
            fmt: 2,
            group: 32,
        };
        // decode and small batches: the skinny kernels by rows
        for (m, want) in [
            (1, GemmKind::Skinny1),
            (3, GemmKind::Skinny4),
            (16, GemmKind::Skinny16),
            (64, GemmKind::Skinny16),
        ] {
            assert_eq!(
                GemmKind::choose(None, m, q4(4096, 4096), sms),
                want,
                "m {m}"
            );
        }
        // large batches: the 128 x 128 tiles, one block a multiprocessor on small grids
        assert_eq!(
            GemmKind::choose(None, 512, q4(4096, 4096), sms),
            GemmKind::Wide1
        );
        assert_eq!(
            GemmKind::choose(None, 512, q4(6144, 4096), sms),
            GemmKind::Wide
        );
        assert_eq!(
            GemmKind::choose(None, 2048, q4(2048, 2048), sms),
            GemmKind::Wide
        );
        // shapes a kernel cannot run fall back, forced or not
        let odd = GemmShape {
            n: 100,
            k: 36,
            fmt: 0,
            group: 0,
        };
        assert_eq!(GemmKind::choose(None, 8, odd, sms), GemmKind::Simple);
        assert_eq!(GemmKind::choose(None, 300, odd, sms), GemmKind::Tiled);
        for forced in [GemmKind::Wide, GemmKind::Wide1, GemmKind::Skinny16] {
            assert_eq!(
                GemmKind::choose(Some(forced), 300, odd, sms),
                GemmKind::Tiled
            );
        }
        let group48 = GemmShape {
            group: 48,
            ..q4(4096, 4608)
        };
        assert_eq!(GemmKind::choose(None, 1, group48, sms), GemmKind::Simple);
        assert_eq!(GemmKind::choose(None, 512, group48, sms), GemmKind::Wide1);
        // forced kernels that can run the shape are kept, at any rows
        assert_eq!(
            GemmKind::choose(Some(GemmKind::Skinny16), 2, q4(4096, 4096), sms),
            GemmKind::Skinny4
        );
        assert_eq!(
            GemmKind::choose(Some(GemmKind::Simple), 2048, q4(4096, 4096), sms),
            GemmKind::Simple
        );
        // the override's names
        assert_eq!(GemmKind::parse(None).ok(), Some(None));
        assert_eq!(GemmKind::parse(Some("auto")).ok(), Some(None));
        assert_eq!(
            GemmKind::parse(Some("wide1")).ok(),
            Some(Some(GemmKind::Wide1))
        );
        let err = GemmKind::parse(Some("fast")).expect_err("unknown");
        assert!(err.to_string().contains("expected auto, simple"), "{err}");
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
