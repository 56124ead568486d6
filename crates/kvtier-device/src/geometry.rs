//! KV geometry of a model.

use crate::DeviceError;

/// How much KV one token and one page take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Attention layers.
    pub layers: u32,
    /// KV planes per layer: 2 for K and V, 1 for a latent (MLA) cache.
    pub planes: u32,
    /// KV heads per plane.
    pub heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Bytes per element (2 for bf16, 1 for fp8).
    pub dtype_bytes: u32,
    /// Tokens per page.
    pub page_size: u32,
}

impl KvGeometry {
    /// Checks that every dimension is positive and that items suit vector copies.
    pub fn validate(&self) -> Result<(), DeviceError> {
        let dims = [
            ("layers", self.layers),
            ("planes", self.planes),
            ("heads", self.heads),
            ("head_dim", self.head_dim),
            ("dtype_bytes", self.dtype_bytes),
            ("page_size", self.page_size),
        ];
        if let Some((name, _)) = dims.iter().find(|(_, v)| *v == 0) {
            return Err(DeviceError::InvalidGeometry(format!(
                "{name} must be positive"
            )));
        }
        if self.planes > 2 {
            return Err(DeviceError::InvalidGeometry("planes must be 1 or 2".into()));
        }
        if !self.item_bytes().is_multiple_of(4) {
            return Err(DeviceError::InvalidGeometry(format!(
                "one page of one plane is {} bytes; kernels copy 4-byte words",
                self.item_bytes()
            )));
        }
        Ok(())
    }

    /// Bytes of one token in one layer (all planes).
    pub fn bytes_per_token_per_layer(&self) -> u64 {
        u64::from(self.planes)
            * u64::from(self.heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// Bytes of one page of one plane of one layer: the unit the kernels copy.
    pub fn item_bytes(&self) -> u64 {
        u64::from(self.page_size)
            * u64::from(self.heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// Bytes of one page in one layer (all planes).
    pub fn page_bytes_per_layer(&self) -> u64 {
        self.item_bytes() * u64::from(self.planes)
    }

    /// Bytes of one page across all layers: a host page.
    pub fn page_bytes(&self) -> u64 {
        self.page_bytes_per_layer() * u64::from(self.layers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama_8b() -> KvGeometry {
        KvGeometry {
            layers: 32,
            planes: 2,
            heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
            page_size: 64,
        }
    }

    #[test]
    fn sizes_of_a_known_model() {
        let g = llama_8b();
        assert_eq!(g.validate(), Ok(()));
        assert_eq!(g.bytes_per_token_per_layer(), 4096);
        assert_eq!(g.item_bytes(), 131_072);
        assert_eq!(g.page_bytes_per_layer(), 262_144);
        assert_eq!(g.page_bytes(), 8 << 20);
    }

    #[test]
    fn bad_geometries_are_refused() {
        let zero = KvGeometry {
            heads: 0,
            ..llama_8b()
        };
        assert!(zero.validate().unwrap_err().to_string().contains("heads"));
        let odd = KvGeometry {
            heads: 1,
            head_dim: 1,
            dtype_bytes: 1,
            page_size: 3,
            ..llama_8b()
        };
        assert!(odd.validate().is_err());
        let planes = KvGeometry {
            planes: 3,
            ..llama_8b()
        };
        assert!(planes.validate().is_err());
    }
}
