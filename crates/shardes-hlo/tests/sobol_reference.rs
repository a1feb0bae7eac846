//! Unshifted Sobol points against SciPy's (`tools/sobol_tables.py` wrote the fixture with
//! `scipy.stats.qmc.Sobol(scramble=False, bits=32)`): exact 32-bit integers, the first 300
//! indices in 13 dimensions from 0 to 21,200.

use shardes_hlo::prng::sobol::{sobol_point, SOBOL_DIMS};

#[test]
fn unshifted_points_equal_scipy_exactly() {
    let text = include_str!("fixtures/sobol_scipy.json");
    let v: serde_json::Value = serde_json::from_str(text).expect("fixture");
    let dims: Vec<usize> = v["dims"]
        .as_array()
        .expect("dims")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect();
    let points = v["points"].as_array().expect("points");
    assert_eq!(points.len(), 300);
    assert_eq!(*dims.last().expect("dims"), SOBOL_DIMS - 1);
    for (i, row) in points.iter().enumerate() {
        let ours = sobol_point(i as u32, SOBOL_DIMS);
        for (c, want) in dims.iter().zip(row.as_array().expect("row")) {
            let want = want.as_u64().expect("integer") as u32;
            assert_eq!(ours[*c], want, "point {i}, dimension {c}");
        }
    }
}
