//! A bounds-checked GGUF (v2/v3, little-endian) reader over a memory map.
//!
//! [`GgufFile::open`] (or [`GgufFile::from_bytes`]) parses the header, the metadata key/value pairs and the tensor
//! infos; tensor data stays in the map and is borrowed with [`GgufFile::tensor_bytes`].
//! Every count, length and offset is checked against the bytes that remain, so a
//! truncated, corrupt or hostile file yields an [`EngineError`], never a panic or a huge
//! allocation. The metadata API (`metadata`, the typed getters) is what the tokenizer
//! builds on, so it stays stable.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use crate::error::{EngineError, Result};

/// The GGUF magic, "GGUF" read as a little-endian u32.
const GGUF_MAGIC: u32 = 0x4655_4747;
/// Deepest array nesting accepted in metadata (real files use 1).
const MAX_ARRAY_DEPTH: usize = 4;
/// Most dimensions a tensor may declare (ggml's GGML_MAX_DIMS).
const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer, whatever its integer width; None for negative
    /// numbers and non-integers.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, whatever its integer width.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => i64::try_from(v).ok(),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an f32 (from F32, F64 or any integer).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Self::F32(v) => Some(v),
            #[allow(clippy::cast_possible_truncation)]
            Self::F64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
}

/// The ggml tensor types this reader knows the block layout of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
}

impl GgmlType {
    /// Maps ggml's numeric type id; None for ids this reader does not know.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            9 => Self::Q8_1,
            10 => Self::Q2K,
            11 => Self::Q3K,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            15 => Self::Q8K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Q8_1 => 32,
            Self::Q2K | Self::Q3K | Self::Q4K | Self::Q5K | Self::Q6K | Self::Q8K => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q8_1 => 36,
            Self::Q2K => 84,
            Self::Q3K => 110,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Q8K => 292,
        }
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2K => "Q2_K",
            Self::Q3K => "Q3_K",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q8K => "Q8_K",
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// ggml dims, innermost (contiguous) first: a weight matrix is `[n_in, n_out]`.
    pub dims: Vec<usize>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section (already validated).
    pub offset: usize,
    /// Size of the data in bytes (already validated to lie inside the file).
    pub size: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.dims.iter().product()
    }
}

/// An open GGUF file: parsed metadata and tensor infos over a memory map.
pub struct GgufFile {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// All metadata key/value pairs.
    pub metadata: BTreeMap<String, GgufValue>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of tensor data (`general.alignment`, default 32).
    pub alignment: usize,
    /// Byte offset of the data section in the file.
    data_offset: usize,
    /// The mapped file.
    map: memmap2::Mmap,
    /// Index of `tensors` by name.
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Opens and parses a GGUF file. The tensor data is memory-mapped, not read.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process; a file truncated by
        // someone else while mapped is outside what this engine defends against (as for
        // every mmap-based model loader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_map(map)
    }

    /// Parses a GGUF file held in memory (a copy is made into an anonymous map; the fuzz
    /// target `gguf` and its corpus replay read files this way).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let io = |source| EngineError::Io {
            path: "<memory>".into(),
            source,
        };
        // (an empty anonymous map is refused by the OS)
        if bytes.is_empty() {
            return Err(EngineError::NotGguf("file is only 0 bytes".into()));
        }
        let mut map = memmap2::MmapMut::map_anon(bytes.len()).map_err(io)?;
        map.copy_from_slice(bytes);
        Self::from_map(map.make_read_only().map_err(io)?)
    }

    fn from_map(map: memmap2::Mmap) -> Result<Self> {
        let bytes: &[u8] = &map;
        let mut r = Reader { buf: bytes, pos: 0 };
        if bytes.len() < 4 {
            return Err(EngineError::NotGguf(format!(
                "file is only {} bytes",
                bytes.len()
            )));
        }
        let magic = r.u32()?;
        if magic != GGUF_MAGIC {
            return Err(EngineError::NotGguf("bad magic (expected \"GGUF\")".into()));
        }
        let version = r.u32()?;
        if version != 2 && version != 3 {
            return Err(EngineError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        // every kv takes at least 12 bytes, every tensor info at least 24
        if n_kv > (r.remaining() / 12) as u64 {
            return Err(EngineError::Truncated(format!(
                "{n_kv} metadata entries cannot fit in the file"
            )));
        }
        if n_tensors > (r.remaining() / 24) as u64 {
            return Err(EngineError::Truncated(format!(
                "{n_tensors} tensor infos cannot fit in the file"
            )));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => {
                let a = v
                    .as_u64()
                    .ok_or_else(|| EngineError::corrupt("general.alignment is not an integer"))?;
                if a == 0 || !a.is_power_of_two() || a > 1 << 20 {
                    return Err(EngineError::corrupt(format!(
                        "general.alignment {a} is not a power of two"
                    )));
                }
                a as usize
            }
        };
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(EngineError::corrupt(format!(
                    "tensor {name}: {n_dims} dimensions"
                )));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = r.u64()?;
                let d = usize::try_from(d)
                    .ok()
                    .filter(|&d| d > 0 && d < 1 << 40)
                    .ok_or_else(|| EngineError::corrupt(format!("tensor {name}: dimension {d}")))?;
                dims.push(d);
            }
            let type_id = r.u32()?;
            let offset = r.u64()?;
            infos.push((name, dims, type_id, offset));
        }
        let header_end = r.pos;
        let data_offset = header_end.div_ceil(alignment) * alignment;
        if data_offset > bytes.len() && !infos.is_empty() {
            return Err(EngineError::Truncated(
                "file ends before the tensor data section".into(),
            ));
        }
        let data_len = bytes.len().saturating_sub(data_offset);
        let mut tensors = Vec::with_capacity(infos.len());
        let mut by_name = BTreeMap::new();
        for (name, dims, type_id, offset) in infos {
            let ggml_type =
                GgmlType::from_id(type_id).ok_or_else(|| EngineError::UnsupportedTensorType {
                    tensor: name.clone(),
                    type_name: format!("ggml type {type_id}"),
                })?;
            let n_el = dims
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n < 1 << 40)
                .ok_or_else(|| {
                    EngineError::corrupt(format!("tensor {name}: element count overflows"))
                })?;
            if dims[0] % ggml_type.block_size() != 0 {
                return Err(EngineError::corrupt(format!(
                    "tensor {name}: row length {} is not a multiple of the {} block size {}",
                    dims[0],
                    ggml_type.name(),
                    ggml_type.block_size()
                )));
            }
            let size = n_el / ggml_type.block_size() * ggml_type.type_size();
            let offset = usize::try_from(offset)
                .ok()
                .filter(|o| o % alignment == 0)
                .ok_or_else(|| {
                    EngineError::corrupt(format!("tensor {name}: offset {offset} is misaligned"))
                })?;
            let end = offset
                .checked_add(size)
                .ok_or_else(|| EngineError::corrupt(format!("tensor {name}: offset overflows")))?;
            if end > data_len {
                return Err(EngineError::Truncated(format!(
                    "tensor {name} needs bytes {offset}..{end} of the data section, which has {data_len}"
                )));
            }
            if by_name.insert(name.clone(), tensors.len()).is_some() {
                return Err(EngineError::corrupt(format!("duplicate tensor {name}")));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
                size,
            });
        }
        Ok(Self {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            map,
            by_name,
        })
    }

    /// The info of the tensor with this name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (its blocks, as stored).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let start = self.data_offset + info.offset;
        // offsets were validated at open; `get` keeps this total anyway
        self.map.get(start..start + info.size).unwrap_or(&[])
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    /// An unsigned integer of any width that fits a u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)
            .and_then(GgufValue::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    }

    /// An unsigned integer of any width that fits a usize.
    pub fn get_usize(&self, key: &str) -> Option<usize> {
        self.get(key)
            .and_then(GgufValue::as_u64)
            .and_then(|v| usize::try_from(v).ok())
    }

    /// A float (F32, F64, or an integer).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(GgufValue::as_f32)
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match self.get(key) {
            Some(GgufValue::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// An array value.
    pub fn get_array(&self, key: &str) -> Option<&[GgufValue]> {
        match self.get(key) {
            Some(GgufValue::Array(a)) => Some(a),
            _ => None,
        }
    }

    /// An array of strings; None if the key is absent or any element is not a string.
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&str>> {
        self.get_array(key)?.iter().map(GgufValue::as_str).collect()
    }
}

/// A cursor over the header bytes; every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(EngineError::Truncated(format!(
                "header needs {n} bytes at offset {} but the file has {}",
                self.pos,
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn len(&mut self, what: &str) -> Result<usize> {
        let n = self.u64()?;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.remaining())
            .ok_or_else(|| {
                EngineError::Truncated(format!(
                    "{what} of length {n} at offset {} runs past the end",
                    self.pos
                ))
            })
    }

    fn string(&mut self) -> Result<String> {
        let n = self.len("string")?;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| {
            EngineError::corrupt(format!("string at offset {} is not UTF-8", self.pos - n))
        })
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => {
                    return Err(EngineError::corrupt(format!(
                        "bool value {b} at offset {}",
                        self.pos - 1
                    )));
                }
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(EngineError::corrupt("metadata arrays nested too deeply"));
                }
                let elem_ty = self.u32()?;
                // every element takes at least one byte, so the count is bounded by the file
                let n = self.len("array")?;
                let mut v = Vec::with_capacity(n.min(1 << 16));
                for _ in 0..n {
                    v.push(self.value(elem_ty, depth + 1)?);
                }
                GgufValue::Array(v)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            t => {
                return Err(EngineError::corrupt(format!(
                    "unknown metadata value type {t} at offset {}",
                    self.pos - 4
                )));
            }
        })
    }
}
