//! MLIR text: the module header and mesh, each function's signature and body, and the
//! per-op counts of that text.
//!
//! Ops are stored as pieces (see `func.rs`); value references resolve here, at print
//! time, so names given late with `Value::named` appear everywhere the value is used.

use std::collections::BTreeMap;

use super::func::{BlockId, FuncState, Function, OpRec, Piece};
use super::sharding::Mesh;

/// The whole module: `module @name attributes {...} {`, the mesh, the functions, `}`.
pub(super) fn module(name: &str, mesh: Option<&Mesh>, funcs: &[Function]) -> String {
    let parts = mesh.map_or(1, |m| m.size());
    let mut out = format!(
        "module @{name} attributes {{mhlo.num_partitions = {parts} : i32, mhlo.num_replicas = 1 : i32}} {{\n"
    );
    if let Some(m) = mesh {
        out.push_str(&format!(
            "  sdy.mesh @mesh = <[\"{}\"={}]>\n",
            m.axis(),
            m.size()
        ));
    }
    for f in funcs {
        f.st.borrow().print(&mut out);
    }
    out.push_str("}\n");
    out
}

/// Op name -> count over the text [`module`] prints, counted from the op records.
///
/// Counts what a line-by-line reading of the text finds: every op of every block
/// (regions and inlined blocks included, region terminators too), named by the dialect
/// op that starts its line, for the dialects `stablehlo`, `sdy`, `func`, `chlo` and `mhlo`.
/// The functions' own `return` is not a dialect op, and the module header and mesh
/// lines are not ops. A `func.func` line is counted only when the signature carries no
/// attributes: on a sharded or donated signature a line reading sees the first
/// attribute (`sdy.sharding = ...`) where an op's results would be.
pub(super) fn op_counts(funcs: &[Function]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for f in funcs {
        let st = f.st.borrow();
        if !st.signature_has_attributes() {
            *counts.entry("func.func".to_string()).or_insert(0) += 1;
        }
        st.count_ops(0, &mut counts);
    }
    counts
}

/// The dialect op an op record prints first: its first text piece up to the first
/// character that cannot be part of an op name (a leading `"` of the generic form skipped).
fn op_name(op: &OpRec) -> Option<&str> {
    let Some(Piece::Text(t)) = op.pieces.first() else {
        return None;
    };
    let t = t.trim_start().trim_start_matches('"');
    let end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(t.len());
    let name = &t[..end];
    let (dialect, _) = name.split_once('.')?;
    matches!(dialect, "stablehlo" | "sdy" | "func" | "chlo" | "mhlo").then_some(name)
}

impl FuncState {
    fn count_ops(&self, b: BlockId, counts: &mut BTreeMap<String, usize>) {
        for op in &self.blocks[b].ops {
            if let Some(name) = op_name(op) {
                *counts.entry(name.to_string()).or_insert(0) += 1;
            }
            for p in &op.pieces {
                if let Piece::Region(r) | Piece::Inline(r) = p {
                    self.count_ops(*r, counts);
                }
            }
        }
    }

    /// The `{...}` attributes of argument `i`: its sharding and its donation.
    fn arg_attrs(&self, i: usize) -> Vec<String> {
        let mut attrs = Vec::new();
        if let (Some(s), Some(m)) = (&self.arg_shardings[i], &self.mesh) {
            attrs.push(format!("sdy.sharding = #sdy.sharding{}", s.mlir(m)));
        }
        if let Some(o) = self.arg_aliases[i] {
            attrs.push(format!("tf.aliasing_output = {o} : i32"));
        }
        attrs
    }

    /// The `{...}` attribute of result `i`: its sharding.
    fn output_attr(&self, i: usize) -> Option<String> {
        match (&self.outputs[i].1, &self.mesh) {
            (Some(s), Some(m)) => Some(format!("sdy.sharding = #sdy.sharding{}", s.mlir(m))),
            _ => None,
        }
    }

    fn signature_has_attributes(&self) -> bool {
        (0..self.blocks[0].args.len()).any(|i| !self.arg_attrs(i).is_empty())
            || (0..self.outputs.len()).any(|i| self.output_attr(i).is_some())
    }

    fn print_block_args(&self, b: BlockId, out: &mut String) {
        let args: Vec<String> = self.blocks[b]
            .args
            .iter()
            .map(|&a| format!("{}: {}", self.value_ref(a), self.values[a].ty))
            .collect();
        out.push_str(&args.join(", "));
    }

    fn print_ops(&self, b: BlockId, indent: usize, out: &mut String) {
        for op in &self.blocks[b].ops {
            self.print_op(op, indent, out);
        }
    }

    fn print_op(&self, op: &OpRec, indent: usize, out: &mut String) {
        if let [Piece::Inline(b)] = op.pieces.as_slice() {
            self.print_ops(*b, indent, out);
            return;
        }
        out.push_str(&" ".repeat(indent));
        match op.results.len() {
            0 => {}
            1 => {
                out.push_str(&self.value_ref(op.results[0]));
                out.push_str(" = ");
            }
            n => {
                let g = self.values[op.results[0]].group;
                out.push_str(&format!("%{}:{} = ", self.groups[g], n));
            }
        }
        for p in &op.pieces {
            match p {
                Piece::Text(s) => out.push_str(s),
                Piece::Val(id) => out.push_str(&self.value_ref(*id)),
                Piece::BlockArgs(b) => self.print_block_args(*b, out),
                Piece::Inline(b) => self.print_ops(*b, indent, out),
                Piece::Region(b) => {
                    out.push_str("{\n");
                    if self.blocks[*b].header {
                        out.push_str(&" ".repeat(indent));
                        out.push_str("^bb0(");
                        self.print_block_args(*b, out);
                        out.push_str("):\n");
                    }
                    self.print_ops(*b, indent + 2, out);
                    out.push_str(&" ".repeat(indent));
                    out.push('}');
                }
            }
        }
        out.push('\n');
    }

    /// `func.func`, its signature with attributes, the body and `return`.
    fn print(&self, out: &mut String) {
        let vis = if self.public { "public" } else { "private" };
        out.push_str(&format!("  func.func {vis} @{}(", self.name));
        let args: Vec<String> = self.blocks[0]
            .args
            .iter()
            .enumerate()
            .map(|(i, &a)| {
                let mut t = format!("{}: {}", self.value_ref(a), self.values[a].ty);
                let attrs = self.arg_attrs(i);
                if !attrs.is_empty() {
                    t.push_str(&format!(" {{{}}}", attrs.join(", ")));
                }
                t
            })
            .collect();
        out.push_str(&args.join(", "));
        out.push(')');
        if !self.outputs.is_empty() {
            let res: Vec<String> = self
                .outputs
                .iter()
                .enumerate()
                .map(|(i, (v, _))| {
                    let mut t = self.values[*v].ty.to_string();
                    if let Some(a) = self.output_attr(i) {
                        t.push_str(&format!(" {{{a}}}"));
                    }
                    t
                })
                .collect();
            out.push_str(&format!(" -> ({})", res.join(", ")));
        }
        out.push_str(" {\n");
        self.print_ops(0, 4, out);
        let refs: Vec<String> = self
            .outputs
            .iter()
            .map(|(v, _)| self.value_ref(*v))
            .collect();
        let tys: Vec<String> = self
            .outputs
            .iter()
            .map(|(v, _)| self.values[*v].ty.to_string())
            .collect();
        if refs.is_empty() {
            out.push_str("    return\n");
        } else {
            out.push_str(&format!(
                "    return {} : {}\n",
                refs.join(", "),
                tys.join(", ")
            ));
        }
        out.push_str("  }\n");
    }
}
