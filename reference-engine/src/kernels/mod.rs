//! The numeric kernels: a thread pool, the packed-panel GEMM and the row-wise operations
//! (dot products, RMSNorm, RoPE, attention, exp), and attention for a group of query heads
//! sharing one key/value head.
//!
//! The invariant every kernel keeps: an output element is computed by one fixed sequence
//! of f32 operations that depends only on the data of its own row, never on how many rows
//! are processed together, how work is split over threads, or which instruction set runs
//! it. The AVX-512, AVX+FMA and scalar paths therefore agree bit for bit (the scalar path
//! uses `f32::mul_add` where the vector paths use a fused multiply-add).

pub mod attention;
pub mod gemm;
pub mod ops;
pub mod pool;

pub use gemm::{Linear, RowSource};
pub use pool::Pool;

/// Which instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust, `f32::mul_add`.
    Scalar,
    /// 256-bit AVX float vectors with FMA3 (x86-64). No AVX2 instruction is used: CPUs with
    /// AVX and FMA but without AVX2 (some virtual machines expose exactly that) run it too.
    Avx,
    /// AVX-512F (x86-64).
    Avx512,
}

impl Isa {
    /// The best instruction set this CPU supports.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Self::Avx;
            }
        }
        Self::Scalar
    }

    /// `want` if this CPU supports it, else the best it does support below it.
    pub fn at_most(want: Self) -> Self {
        let best = Self::detect();
        match (want, best) {
            (Self::Scalar, _) | (_, Self::Scalar) => Self::Scalar,
            (Self::Avx, _) | (_, Self::Avx) => Self::Avx,
            _ => Self::Avx512,
        }
    }
}

/// What every kernel call needs: the pool and the instruction set.
#[derive(Debug)]
pub struct Ctx {
    /// Threads for parallel kernels.
    pub pool: Pool,
    /// Instruction set in use.
    pub isa: Isa,
}

/// A raw pointer that threads may share to write disjoint parts of one buffer.
#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub *mut f32);
// SAFETY: users only write disjoint index ranges from different threads.
unsafe impl Send for SyncPtr {}
// SAFETY: as above.
unsafe impl Sync for SyncPtr {}

#[cfg(test)]
mod isa_coverage {
    use super::Isa;

    /// The ISA-specific kernel tests ask for each ISA through [`Isa::at_most`], which falls
    /// back to what the CPU has: on a CPU without AVX+FMA or AVX-512 they would pass while
    /// testing less. Under CI that is a failure, unless `SAMEWISE_ACK_MISSING_ISA` names the
    /// best ISA the machine has (`scalar` or `avx`), acknowledging the gap on purpose.
    #[test]
    fn every_isa_is_exercised_or_the_gap_is_acknowledged() {
        let best = Isa::detect();
        if best == Isa::Avx512 {
            return;
        }
        let acked = std::env::var("SAMEWISE_ACK_MISSING_ISA").unwrap_or_default();
        let name = match best {
            Isa::Scalar => "scalar",
            Isa::Avx => "avx",
            Isa::Avx512 => "avx512",
        };
        assert!(
            std::env::var_os("CI").is_none() || acked == name,
            "this CPU's best ISA is {name}: the AVX-512{} kernel paths are not tested here; \
             set SAMEWISE_ACK_MISSING_ISA={name} to accept that",
            if best == Isa::Scalar {
                " and AVX+FMA"
            } else {
                ""
            }
        );
    }
}
