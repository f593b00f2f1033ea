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

    /// Bytes of keys and values held on the host.
    pub(crate) fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| (k.len() + v.len()) * std::mem::size_of::<f32>())
            .sum()
    }

    /// A new cache holding this one's first `n` positions, bit for bit as if only they had
    /// been processed (key lanes past `n` in the last block zeroed, as a fresh cache has
    /// them). None when fewer than `n` positions are cached here, or when the cache lives on
    /// the GPU.
    pub(crate) fn prefix(&self, n: usize) -> Option<KvCache> {
        #[cfg(feature = "cuda")]
        if self.dev.is_some() {
            return None;
        }
        if n > self.len {
            return None;
        }
        let layers = self
            .layers
            .iter()
            .map(|(k, v)| {
                // row width from the values: `len` rows of `kvd` floats
                let kvd = v.len().checked_div(self.len).unwrap_or(0);
                let blocks = n.div_ceil(16);
                let mut k = k[..blocks * kvd * 16].to_vec();
                if !n.is_multiple_of(16) {
                    let last = &mut k[(blocks - 1) * kvd * 16..];
                    for lanes in last.chunks_exact_mut(16) {
                        lanes[n % 16..].fill(0.0);
                    }
                }
                (k, v[..n * kvd].to_vec())
            })
            .collect();
        Some(KvCache {
            layers,
            len: n,
            #[cfg(feature = "cuda")]
            dev: None,
        })
    }
}
