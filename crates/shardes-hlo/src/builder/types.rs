//! Element types, tensor types, host element values for constants, and the printed
//! forms of type lists and function types.

use std::fmt;

/// Element type of a tensor, spelled as in StableHLO (`f32`, `ui32`, `i1`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 64-bit IEEE float.
    F64,
    /// bfloat16.
    BF16,
    /// 16-bit IEEE float.
    F16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 32-bit integer (`ui32`).
    U32,
    /// Unsigned 8-bit integer (`ui8`).
    U8,
    /// Boolean (`i1`).
    I1,
}

impl DType {
    /// The MLIR spelling of the element type.
    pub fn mlir(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "ui32",
            DType::U8 => "ui8",
            DType::I1 => "i1",
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// True for the integer types, booleans excluded.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U32 | DType::U8)
    }

    /// True for signed integers.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// True for unsigned integers and booleans (compared `UNSIGNED`).
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U32 | DType::U8 | DType::I1)
    }

    /// Width of one element in bits.
    pub fn bits(self) -> u32 {
        match self {
            DType::F64 | DType::I64 => 64,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::BF16 | DType::F16 => 16,
            DType::U8 => 8,
            DType::I1 => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir())
    }
}

/// A ranked tensor type with static shape, printed `tensor<4x8xf32>` (rank 0: `tensor<f32>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Static dimensions, outermost first.
    pub shape: Vec<i64>,
}

impl TensorType {
    /// A tensor type of `dtype` with the given shape.
    pub fn new(dtype: DType, shape: &[i64]) -> Self {
        TensorType {
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// A rank-0 tensor type.
    pub fn scalar(dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: Vec::new(),
        }
    }

    /// Shorthand for an f32 tensor type.
    pub fn f32(shape: &[i64]) -> Self {
        Self::new(DType::F32, shape)
    }

    /// Shorthand for a u32 tensor type.
    pub fn u32(shape: &[i64]) -> Self {
        Self::new(DType::U32, shape)
    }

    /// Shorthand for an i32 tensor type.
    pub fn i32(shape: &[i64]) -> Self {
        Self::new(DType::I32, shape)
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (product of the dimensions; 1 for rank 0).
    pub fn num_elements(&self) -> i64 {
        self.shape.iter().product()
    }

    /// The same shape with another element type.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType {
            dtype,
            shape: self.shape.clone(),
        }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.dtype)
    }
}

/// Host element types that can be baked into constants.
///
/// Floats are printed as decimal literals only when the literal parses back to the
/// same bits (checked both directly and through f64, whichever way MLIR parses it);
/// otherwise the exact bit pattern is printed in hex.
pub trait Element: Copy + PartialEq + sealed::Sealed {
    /// The element type of constants built from this host type.
    const DTYPE: DType;
    /// A decimal literal that round-trips exactly, or `None` if only hex is exact.
    fn literal(self) -> Option<String>;
    /// The bit pattern as a fixed-width hex integer (`0x3F800000`), for scalar splats.
    fn hex_bits(self) -> String;
    /// Appends the little-endian bytes (for `dense<"0x...">`).
    fn push_le(self, out: &mut Vec<u8>);
    /// Converts from an f64 if exactly representable (used by `const_like`).
    fn from_f64(x: f64) -> Option<Self>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for u32 {}
    impl Sealed for u8 {}
    impl Sealed for bool {}
}

/// MLIR float literals need a `.` in the mantissa; Rust's `{:e}` omits it for integers.
fn float_lit(s: String) -> String {
    match s.find('e') {
        Some(pos) if !s[..pos].contains('.') => format!("{}.0{}", &s[..pos], &s[pos..]),
        _ => s,
    }
}

/// f32 and f64: a decimal literal where it reads back to the same bits (through the type
/// itself and through f64, as parsers differ), hex bits otherwise; `width` hex digits.
macro_rules! float_element {
    ($t:ty, $d:expr, $width:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn literal(self) -> Option<String> {
                if !self.is_finite() {
                    return None;
                }
                let s = float_lit(format!("{self:e}"));
                let direct = s.parse::<$t>().ok()?;
                let via64 = s.parse::<f64>().ok()? as $t;
                (direct.to_bits() == self.to_bits() && via64.to_bits() == self.to_bits())
                    .then_some(s)
            }
            fn hex_bits(self) -> String {
                format!("0x{:0w$X}", self.to_bits(), w = $width)
            }
            fn push_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn from_f64(x: f64) -> Option<Self> {
                // Exact for f64 (NaN included); f32 takes only what it holds exactly.
                let y = x as $t;
                (y as f64 == x || x.is_nan()).then_some(y)
            }
        }
    };
}

float_element!(f32, DType::F32, 8);
float_element!(f64, DType::F64, 16);

/// The 16-bit floats: always printed as hex bits, since decimal → bf16/f16 conversion
/// paths differ between parsers and hex is always exact.
macro_rules! half_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn literal(self) -> Option<String> {
                None
            }
            fn hex_bits(self) -> String {
                format!("0x{:04X}", self.to_bits())
            }
            fn push_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_bits().to_le_bytes());
            }
            fn from_f64(x: f64) -> Option<Self> {
                let y = <$t>::from_f64(x);
                (y.to_f64() == x || x.is_nan()).then_some(y)
            }
        }
    };
}

half_element!(half::bf16, DType::BF16);
half_element!(half::f16, DType::F16);

macro_rules! int_element {
    ($t:ty, $d:expr, $w:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn literal(self) -> Option<String> {
                Some(self.to_string())
            }
            fn hex_bits(self) -> String {
                format!("0x{:0w$X}", self, w = $w)
            }
            fn push_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn from_f64(x: f64) -> Option<Self> {
                let y = x as $t;
                (y as f64 == x).then_some(y)
            }
        }
    };
}
int_element!(i32, DType::I32, 8);
int_element!(i64, DType::I64, 16);
int_element!(u32, DType::U32, 8);
int_element!(u8, DType::U8, 2);

impl Element for bool {
    const DTYPE: DType = DType::I1;
    fn literal(self) -> Option<String> {
        Some(if self { "true" } else { "false" }.to_string())
    }
    fn hex_bits(self) -> String {
        if self { "true" } else { "false" }.to_string()
    }
    fn push_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn from_f64(x: f64) -> Option<Self> {
        if x == 0.0 {
            Some(false)
        } else if x == 1.0 {
            Some(true)
        } else {
            None
        }
    }
}

/// Prints the `dense<...>` attribute body for `data` of `shape` (element count already checked).
pub(crate) fn dense_literal<T: Element>(shape: &[i64], data: &[T]) -> String {
    let Some(first) = data.first() else {
        return String::new();
    };
    let mut bytes = Vec::with_capacity(data.len() * 8);
    for x in data {
        x.push_le(&mut bytes);
    }
    // Splat detection compares bit patterns, so NaN splats stay splats.
    let width = bytes.len() / data.len();
    if bytes.chunks_exact(width).all(|c| c == &bytes[..width]) {
        return first.literal().unwrap_or_else(|| first.hex_bits());
    }
    let lits: Option<Vec<String>> = data.iter().map(|x| x.literal()).collect();
    match lits {
        Some(lits) => nested(shape, &lits),
        None => {
            let mut s = String::with_capacity(bytes.len() * 2 + 4);
            s.push_str("\"0x");
            for b in bytes {
                s.push_str(&format!("{b:02X}"));
            }
            s.push('"');
            s
        }
    }
}

fn nested(shape: &[i64], lits: &[String]) -> String {
    if shape.is_empty() {
        return lits.first().cloned().unwrap_or_default();
    }
    let outer = shape[0].max(1) as usize;
    let chunk = lits.len() / outer;
    let parts: Vec<String> = (0..shape[0] as usize)
        .map(|i| nested(&shape[1..], &lits[i * chunk..(i + 1) * chunk]))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Comma-separated tensor types (`tensor<2xf32>, tensor<i32>`).
pub(crate) fn join_types(tys: &[TensorType]) -> String {
    tys.iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A function type as MLIR prints it: `(a, b) -> c` or `(a) -> (b, c)`.
pub(crate) fn fn_type(args: &[TensorType], results: &[TensorType]) -> String {
    let res = if results.len() == 1 {
        results[0].to_string()
    } else {
        format!("({})", join_types(results))
    };
    format!("({}) -> {}", join_types(args), res)
}
