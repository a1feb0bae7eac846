//! A decoded view of the optimized (partitioned) HLO module of an executable.

use std::collections::BTreeMap;

use prost::Message;

use crate::dtype::ElementType;
use crate::error::{Result, RuntimeError};
use crate::proto;

/// An HLO module as XLA compiled it (after SPMD partitioning: shapes are per device).
#[derive(Debug, Clone, PartialEq)]
pub struct HloModule {
    /// Module name.
    pub name: String,
    /// Name of the entry computation.
    pub entry: String,
    /// All computations (entry, fusions, reducers, ...).
    pub computations: Vec<HloComputation>,
}

/// One HLO computation.
#[derive(Debug, Clone, PartialEq)]
pub struct HloComputation {
    /// Computation name.
    pub name: String,
    /// Its instructions, in the order XLA stored them.
    pub instructions: Vec<HloInstruction>,
}

/// One HLO instruction. `Display` prints `opcode shape`, e.g. `all-reduce f32[16]`.
#[derive(Debug, Clone, PartialEq)]
pub struct HloInstruction {
    /// Instruction name (e.g. `all-reduce.1`).
    pub name: String,
    /// Opcode (e.g. `all-reduce`, `fusion`, `parameter`).
    pub opcode: String,
    /// Result shape.
    pub shape: HloShape,
    /// For `parameter` instructions: the parameter index.
    pub parameter_number: Option<usize>,
}

/// An HLO shape: an array (`element_type` + `dims`) or a tuple (`element_type == "tuple"`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HloShape {
    /// XLA spelling of the element type (`f32`, `bf16`, `pred`, `tuple`, `token`, ...).
    pub element_type: String,
    /// Dimensions (arrays only).
    pub dims: Vec<usize>,
    /// Element shapes (tuples only).
    pub tuple: Vec<HloShape>,
}

impl HloModule {
    /// Decodes a serialized `HloModuleProtoWithConfig` (`with_config = true`) or bare
    /// `HloModuleProto`.
    pub(crate) fn decode(bytes: &[u8], with_config: bool) -> Result<HloModule> {
        let err = |e: prost::DecodeError| RuntimeError::Decode {
            what: "optimized HLO module",
            reason: e.to_string(),
        };
        let module = if with_config {
            proto::HloModuleProtoWithConfig::decode(bytes)
                .map_err(err)?
                .hlo_module
                .unwrap_or_default()
        } else {
            proto::HloModuleProto::decode(bytes).map_err(err)?
        };
        Ok(HloModule {
            name: module.name,
            entry: module.entry_computation_name,
            computations: module
                .computations
                .into_iter()
                .map(|c| HloComputation {
                    name: c.name,
                    instructions: c
                        .instructions
                        .into_iter()
                        .map(|i| {
                            let is_param = i.opcode == "parameter";
                            HloInstruction {
                                name: i.name,
                                opcode: i.opcode,
                                shape: i.shape.map(HloShape::from_proto).unwrap_or_default(),
                                parameter_number: is_param
                                    .then(|| usize::try_from(i.parameter_number).ok())
                                    .flatten(),
                            }
                        })
                        .collect(),
                })
                .collect(),
        })
    }

    /// Every instruction of every computation.
    pub fn instructions(&self) -> impl Iterator<Item = &HloInstruction> {
        self.computations.iter().flat_map(|c| c.instructions.iter())
    }

    /// How many instructions of each opcode the module holds, over all computations (entry,
    /// fusion bodies, reducers, ...), e.g. `{"all-reduce": 1, "parameter": 5, ...}`.
    pub fn opcode_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for i in self.instructions() {
            *counts.entry(i.opcode.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// The entry computation, if present.
    pub fn entry_computation(&self) -> Option<&HloComputation> {
        self.computations.iter().find(|c| c.name == self.entry)
    }

    /// Shapes of the entry computation's parameters, by parameter number.
    pub fn entry_parameters(&self) -> Vec<HloShape> {
        let Some(entry) = self.entry_computation() else {
            return Vec::new();
        };
        let mut params: Vec<(usize, &HloShape)> = entry
            .instructions
            .iter()
            .filter_map(|i| i.parameter_number.map(|n| (n, &i.shape)))
            .collect();
        params.sort_by_key(|(n, _)| *n);
        params.into_iter().map(|(_, s)| s.clone()).collect()
    }
}

impl HloShape {
    fn from_proto(s: proto::ShapeProto) -> HloShape {
        HloShape {
            element_type: primitive_name(s.element_type),
            dims: s
                .dimensions
                .into_iter()
                .map(|d| usize::try_from(d).unwrap_or(0))
                .collect(),
            tuple: s
                .tuple_shapes
                .into_iter()
                .map(HloShape::from_proto)
                .collect(),
        }
    }

    /// Our element type for an array shape, `None` for tuples/tokens/exotic types.
    pub fn array_type(&self) -> Option<ElementType> {
        match self.element_type.as_str() {
            "pred" => Some(ElementType::Pred),
            "s8" => Some(ElementType::S8),
            "s16" => Some(ElementType::S16),
            "s32" => Some(ElementType::S32),
            "s64" => Some(ElementType::S64),
            "u8" => Some(ElementType::U8),
            "u16" => Some(ElementType::U16),
            "u32" => Some(ElementType::U32),
            "u64" => Some(ElementType::U64),
            "f16" => Some(ElementType::F16),
            "bf16" => Some(ElementType::BF16),
            "f32" => Some(ElementType::F32),
            "f64" => Some(ElementType::F64),
            _ => None,
        }
    }
}

/// XLA `PrimitiveType` number → its HLO spelling.
fn primitive_name(t: i32) -> String {
    if let Some(e) = ElementType::from_xla_primitive(t) {
        return e.name().to_string();
    }
    match t {
        13 => "tuple".into(),
        14 => "opaque".into(),
        15 => "c64".into(),
        17 => "token".into(),
        18 => "c128".into(),
        other => format!("type{other}"),
    }
}

impl std::fmt::Display for HloShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.element_type == "tuple" {
            f.write_str("(")?;
            for (i, s) in self.tuple.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{s}")?;
            }
            return f.write_str(")");
        }
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        write!(f, "{}[{}]", self.element_type, dims.join(","))
    }
}

impl std::fmt::Display for HloInstruction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.opcode, self.shape)
    }
}
