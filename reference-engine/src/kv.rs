//! The per-sequence KV cache: for every layer, the keys (after RoPE) and values of every
//! position processed so far. Values are rows `[pos][n_head_kv * head_dim]`; keys are
//! blocks of 16 positions `[pos / 16][n_head_kv * head_dim][pos % 16]`, so that attention
//! scores 16 keys per vector instruction (each score still one sequential FMA chain).

/// One sequence's cache.
#[derive(Debug, Default)]
pub struct KvCache {
    /// Per layer: (keys in 16-position blocks, values as rows).
    pub(crate) layers: Vec<(Vec<f32>, Vec<f32>)>,
    /// Positions fully processed (through every layer).
    pub(crate) len: usize,
    /// The same on the GPU, for an engine on the CUDA backend (`layers` then stays empty
    /// per layer).
    #[cfg(feature = "cuda")]
    pub(crate) dev: Option<crate::cuda::DevCache>,
}

impl KvCache {
    /// An empty cache for `n_layer` layers.
    pub fn new(n_layer: usize) -> Self {
        Self {
            layers: vec![(Vec::new(), Vec::new()); n_layer],
            len: 0,
            #[cfg(feature = "cuda")]
            dev: None,
        }
    }
}
