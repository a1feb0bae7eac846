//! Row gathers and scatters along dimension 0 (embedding lookups and their updates), and
//! the column gather of a matrix stored transposed.

use super::{dtype_err, list, shape_err, ulist};
use crate::builder::error::Result;
use crate::builder::func::{RegionSpec, Value, P};
use crate::builder::types::TensorType;

impl Value {
    /// Row lookup `table[ids]`: the result has shape `ids.shape + table.shape[1..]`.
    /// Out-of-range ids are clamped (XLA gather semantics).
    pub fn take_rows(&self, ids: &Value) -> Result<Value> {
        let op = "take_rows";
        if self.rank() < 1 {
            return Err(shape_err(op, &[self, ids], "the table needs rank >= 1"));
        }
        let idx = start_indices(op, self, ids)?;
        let r = ids.rank();
        let mut shape = ids.shape().to_vec();
        shape.extend_from_slice(&self.shape()[1..]);
        let offset: Vec<usize> = (r..r + self.rank() - 1).collect();
        let offset = if offset.is_empty() {
            String::new()
        } else {
            format!("offset_dims = [{}], ", ulist(&offset))
        };
        let mut sizes = vec![1];
        sizes.extend_from_slice(&self.shape()[1..]);
        let dims = format!(
            "{offset}collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = {r}"
        );
        self.gather(op, &idx, &dims, &sizes, &shape)
    }

    /// Column lookup of a matrix, `tableᵀ[ids]`: for a `(d, n)` table the result has shape
    /// `ids.shape + [d]`, column `ids[..]` of the table as a row. The lookup of an
    /// embedding stored transposed (`(d, vocab)`), without transposing the table.
    /// Out-of-range ids are clamped (XLA gather semantics).
    pub fn take_cols(&self, ids: &Value) -> Result<Value> {
        let op = "take_cols";
        if self.rank() != 2 {
            return Err(shape_err(
                op,
                &[self, ids],
                "the table must be a matrix (rank 2)",
            ));
        }
        let idx = start_indices(op, self, ids)?;
        let r = ids.rank();
        let d = self.shape()[0];
        let mut shape = ids.shape().to_vec();
        shape.push(d);
        let dims = format!(
            "offset_dims = [{r}], collapsed_slice_dims = [1], start_index_map = [1], index_vector_dim = {r}"
        );
        self.gather(op, &idx, &dims, &[d, 1], &shape)
    }

    /// `stablehlo.gather` of this table at start indices `idx` with dimension numbers
    /// `dims`, slices of `sizes`, into an array of `shape`.
    fn gather(
        &self,
        op: &str,
        idx: &Value,
        dims: &str,
        sizes: &[i64],
        shape: &[i64],
    ) -> Result<Value> {
        let out = TensorType::new(self.dtype(), shape);
        let p = P::new().t("\"stablehlo.gather\"(").v(self).t(", ").v(idx).t(format!(
            ") <{{dimension_numbers = #stablehlo.gather<{dims}>, indices_are_sorted = false, slice_sizes = array<i64: {}>}}> : ({}, {}) -> {out}",
            list(sizes),
            self.ty,
            idx.ty
        ));
        self.func().emit1(op, &[self, idx], p, out)
    }

    fn scatter_rows_with(
        &self,
        op: &str,
        ids: &Value,
        updates: &Value,
        add: bool,
    ) -> Result<Value> {
        let all = [self, ids, updates];
        if self.rank() < 1
            || ids.rank() != 1
            || updates.rank() != self.rank()
            || updates.shape()[0] != ids.shape()[0]
            || updates.shape()[1..] != self.shape()[1..]
        {
            return Err(shape_err(
                op,
                &all,
                "need operand [n, rest...], ids [k] and updates [k, rest...]",
            ));
        }
        if !ids.dtype().is_int() {
            return Err(dtype_err(
                op,
                &all,
                "ids must be integers; convert them to i32",
            ));
        }
        if updates.dtype() != self.dtype() {
            return Err(dtype_err(
                op,
                &all,
                "updates need the operand's element type",
            ));
        }
        let f = self.func();
        let idx = ids.broadcast_in_dim(&[ids.shape()[0], 1], &[0])?;
        let scal = TensorType::scalar(self.dtype());
        let spec = RegionSpec::body(true);
        let (block, _) = f.region(op, spec, &[scal.clone(), scal], |a| -> Result<_> {
            if add {
                Ok(vec![a[0].add(&a[1])?])
            } else {
                Ok(vec![a[1].clone()])
            }
        })?;
        let window: Vec<usize> = (1..self.rank()).collect();
        let window = if window.is_empty() {
            String::new()
        } else {
            format!("update_window_dims = [{}], ", ulist(&window))
        };
        let p = P::new()
            .t("\"stablehlo.scatter\"(")
            .vs(&[self, &idx, updates])
            .t(format!(
                ") <{{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<{window}inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false}}> ("
            ))
            .region(block)
            .t(format!(") : ({}, {}, {}) -> {}", self.ty, idx.ty, updates.ty, self.ty));
        f.emit1(op, &[self, &idx, updates], p, self.ty.clone())
    }

    /// `operand[ids[j]] = updates[j]` for each row `j` (later duplicates win, unspecified order).
    pub fn scatter_rows(&self, ids: &Value, updates: &Value) -> Result<Value> {
        self.scatter_rows_with("scatter_rows", ids, updates, false)
    }

    /// `operand[ids[j]] += updates[j]` for each row `j`.
    pub fn scatter_add_rows(&self, ids: &Value, updates: &Value) -> Result<Value> {
        self.scatter_rows_with("scatter_add_rows", ids, updates, true)
    }
}

/// `ids` as a gather's start indices (a trailing index vector of one); integers only.
fn start_indices(op: &str, table: &Value, ids: &Value) -> Result<Value> {
    if !ids.dtype().is_int() {
        return Err(dtype_err(
            op,
            &[table, ids],
            "ids must be integers; convert them to i32",
        ));
    }
    let r = ids.rank();
    let mut ishape = ids.shape().to_vec();
    ishape.push(1);
    ids.broadcast_in_dim(&ishape, &(0..r).collect::<Vec<_>>())
}
