//! The one bridge between the two element-type vocabularies: the builder's [`DType`] (what a
//! program declares) and the runtime's [`ElementType`] (what a buffer holds).

use shardes_hlo::builder::DType;
use shardes_runtime::ElementType;

/// The runtime element type of a program's `DType`. Every `DType` has one.
pub fn element_type(d: DType) -> ElementType {
    match d {
        DType::F32 => ElementType::F32,
        DType::F64 => ElementType::F64,
        DType::BF16 => ElementType::BF16,
        DType::F16 => ElementType::F16,
        DType::I32 => ElementType::S32,
        DType::I64 => ElementType::S64,
        DType::U32 => ElementType::U32,
        DType::U8 => ElementType::U8,
        DType::I1 => ElementType::Pred,
    }
}

/// The builder's `DType` of a runtime element type, where the builder has one.
pub fn dtype(e: ElementType) -> Option<DType> {
    [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U8,
        DType::I1,
    ]
    .into_iter()
    .find(|&d| element_type(d) == e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_vocabularies_round_trip() {
        for d in [DType::F32, DType::BF16, DType::I32, DType::U32, DType::I1] {
            assert_eq!(dtype(element_type(d)), Some(d));
        }
        assert_eq!(dtype(ElementType::S8), None);
    }
}
