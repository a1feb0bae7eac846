//! Fitness shaping (fitness → weights), from semantics.md "Shaping".

/// `centered_ranks`: NaN → +inf; midranks (ties share the mean of their 0-based positions,
/// in f32); `w = midrank · f32(1/(n − 1)) − 0.5`. `n < 2` gives zeros.
pub fn centered_ranks(f: &[f32]) -> Vec<f32> {
    let n = f.len();
    if n < 2 {
        return vec![0.0; n];
    }
    let v: Vec<f32> = f
        .iter()
        .map(|&x| if x.is_nan() { f32::INFINITY } else { x })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut w = vec![0.0f32; n];
    // XLA rewrites division by a constant into multiplication by its f32 reciprocal; the
    // JAX reference's weights are bit-exact only in that form (`/` is 1 ulp off for 111 of
    // the quickstart's 256 weights).
    let inv = 1.0 / (n - 1) as f32;
    let mut p = 0;
    while p < n {
        let mut q = p;
        // total_cmp separates -0.0 from +0.0; ties are by value, as the spec means.
        while q + 1 < n && v[order[q + 1]] == v[order[p]] {
            q += 1;
        }
        let mid = (p as f32 + q as f32) / 2.0;
        for &i in &order[p..=q] {
            w[i] = mid * inv - 0.5;
        }
        p = q + 1;
    }
    w
}

/// `centered`: `w = (f − mean f) · n/(n − 1)`; `n < 2` gives `f`.
pub fn centered(f: &[f32]) -> Vec<f32> {
    let n = f.len();
    if n < 2 {
        return f.to_vec();
    }
    let mut sum = 0.0f32;
    for x in f {
        sum += x;
    }
    let mean = sum / n as f32;
    let k = n as f32 / (n - 1) as f32;
    f.iter().map(|x| (x - mean) * k).collect()
}

/// `group_relative` for fitness `(n, g)` row-major: per task, mean and population std over
/// members; advantage `(f − μ)/sd` where `sd > 0`, exactly 0 where `sd = 0`; `w` is the
/// mean advantage over tasks.
pub fn group_relative(f: &[f32], n: usize, g: usize) -> Vec<f32> {
    assert_eq!(f.len(), n * g, "fitness must be (n, g)");
    let mut w = vec![0.0f32; n];
    for t in 0..g {
        let mut sum = 0.0f32;
        for i in 0..n {
            sum += f[i * g + t];
        }
        let mu = sum / n as f32;
        let mut var = 0.0f32;
        for i in 0..n {
            let e = f[i * g + t] - mu;
            var += e * e;
        }
        let sd = (var / n as f32).sqrt();
        if sd > 0.0 {
            for i in 0..n {
                w[i] += (f[i * g + t] - mu) / sd;
            }
        }
    }
    w.iter().map(|x| x / g as f32).collect()
}

/// `none`: `w = f`.
pub fn none(f: &[f32]) -> Vec<f32> {
    f.to_vec()
}
