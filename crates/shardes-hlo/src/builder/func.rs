//! Function bodies: the arena of values, blocks and op records, scoping and regions.
//!
//! A [`Func`] is a cheap handle (`Rc`) to one function under construction. Every
//! [`Value`] holds the same handle plus its SSA id, so ops are plain methods on values.
//! Regions (while bodies, reduce bodies, sort comparators, manual computations) are
//! built by closures: while a closure runs, new ops go into the region's block.
//!
//! An op is recorded as [`Piece`]s (built with [`P`]) rather than as text, so that values
//! renamed later with [`Value::named`] print under their final name; `printer.rs` turns
//! the records into MLIR text.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::rc::Rc;

use super::error::{HloError, Result};
use super::sharding::{Mesh, Sharding};
use super::types::TensorType;

pub(crate) type ValueId = usize;
pub(crate) type BlockId = usize;

/// One piece of an op's printed text: literal text, a value reference (resolved at
/// print time so that renaming with [`Value::named`] works), or a nested region.
#[derive(Clone, Debug)]
pub(crate) enum Piece {
    Text(String),
    Val(ValueId),
    /// A region: `{`, optional `^bb0(args):` header, the ops, `}`.
    Region(BlockId),
    /// `%a: tensor<..>, %b: tensor<..>` for a block's arguments (manual_computation style).
    BlockArgs(BlockId),
    /// A block printed inline at the op's position (its arguments alias outer values).
    Inline(BlockId),
}

/// Builds the piece list of one op.
#[derive(Default)]
pub(crate) struct P(pub(crate) Vec<Piece>);

impl P {
    pub(crate) fn new() -> Self {
        P(Vec::new())
    }
    pub(crate) fn t(mut self, s: impl Into<String>) -> Self {
        self.0.push(Piece::Text(s.into()));
        self
    }
    pub(crate) fn v(mut self, v: &Value) -> Self {
        self.0.push(Piece::Val(v.id));
        self
    }
    /// Values separated by `, `.
    pub(crate) fn vs(mut self, vals: &[&Value]) -> Self {
        for (i, v) in vals.iter().enumerate() {
            if i > 0 {
                self.0.push(Piece::Text(", ".into()));
            }
            self.0.push(Piece::Val(v.id));
        }
        self
    }
    pub(crate) fn region(mut self, b: BlockId) -> Self {
        self.0.push(Piece::Region(b));
        self
    }
    pub(crate) fn block_args(mut self, b: BlockId) -> Self {
        self.0.push(Piece::BlockArgs(b));
        self
    }
}

#[derive(Debug)]
pub(crate) struct OpRec {
    pub(super) results: Vec<ValueId>,
    pub(super) pieces: Vec<Piece>,
}

#[derive(Debug)]
pub(super) struct ValueInfo {
    pub(super) ty: TensorType,
    /// The SSA name group (`%name`, or `%name#i` for result `i` of a multi-result op).
    pub(super) group: usize,
    index: Option<usize>,
    block: BlockId,
    /// Printed as this other value (arguments of inlined blocks).
    alias: Option<ValueId>,
}

#[derive(Debug)]
pub(super) struct BlockInfo {
    parent: Option<BlockId>,
    isolated: bool,
    manual: Option<i64>,
    /// Printed with a `^bb0(args):` header.
    pub(super) header: bool,
    open: bool,
    pub(super) args: Vec<ValueId>,
    pub(super) ops: Vec<OpRec>,
}

/// A call made from this function, checked against the module when the function is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallRecord {
    pub(crate) callee: Callee,
}

#[derive(Debug)]
pub(crate) struct FuncState {
    pub(crate) name: String,
    pub(crate) public: bool,
    pub(crate) mesh: Option<Mesh>,
    pub(crate) uses_mesh: bool,
    pub(super) values: Vec<ValueInfo>,
    pub(super) groups: Vec<String>,
    used: HashSet<String>,
    next_auto: usize,
    /// Block 0 is the function body; the others are regions, in creation order.
    pub(super) blocks: Vec<BlockInfo>,
    stack: Vec<BlockId>,
    pub(super) arg_shardings: Vec<Option<Sharding>>,
    /// Output index each argument is donated to (`tf.aliasing_output`), if any.
    pub(super) arg_aliases: Vec<Option<usize>>,
    pub(super) outputs: Vec<(ValueId, Option<Sharding>)>,
    pub(crate) calls: Vec<CallRecord>,
    next_channel: i64,
    finished: bool,
}

/// Region properties chosen by the op that owns the region.
pub(crate) struct RegionSpec {
    /// Values from enclosing blocks may not be used inside (reduce bodies, comparators, shard_map).
    pub(crate) isolated: bool,
    /// Marks a manual-computation body with the mesh size (collectives are legal inside).
    pub(crate) manual: Option<i64>,
    /// Print `^bb0(args):` inside the braces (generic op form).
    pub(crate) header: bool,
    /// Terminator op name, e.g. `stablehlo.return`.
    pub(crate) terminator: &'static str,
}

impl RegionSpec {
    /// A generic-form body ending in `stablehlo.return` (reduce, sort, scatter, while);
    /// `isolated` says whether enclosing values are off limits.
    pub(crate) const fn body(isolated: bool) -> Self {
        RegionSpec {
            isolated,
            manual: None,
            header: true,
            terminator: "stablehlo.return",
        }
    }
}

fn sanitize(hint: &str) -> String {
    let mut s: String = hint
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "v_");
    }
    s
}

impl FuncState {
    fn fresh_name(&mut self, hint: Option<&str>) -> String {
        let name = match hint {
            Some(h) => {
                let base = sanitize(h);
                let mut cand = base.clone();
                let mut k = 1;
                while self.used.contains(&cand) {
                    cand = format!("{base}_{k}");
                    k += 1;
                }
                cand
            }
            None => loop {
                let cand = self.next_auto.to_string();
                self.next_auto += 1;
                if !self.used.contains(&cand) {
                    break cand;
                }
            },
        };
        self.used.insert(name.clone());
        name
    }

    fn new_value(
        &mut self,
        ty: TensorType,
        group: usize,
        index: Option<usize>,
        block: BlockId,
    ) -> ValueId {
        self.values.push(ValueInfo {
            ty,
            group,
            index,
            block,
            alias: None,
        });
        self.values.len() - 1
    }

    fn current(&self) -> BlockId {
        self.stack.last().copied().unwrap_or(0)
    }

    /// The SSA reference of `id` as printed (`%x`, `%3#1`), following inline aliases.
    pub(super) fn value_ref(&self, id: ValueId) -> String {
        let mut v = &self.values[id];
        while let Some(a) = v.alias {
            v = &self.values[a];
        }
        match v.index {
            Some(i) => format!("%{}#{}", self.groups[v.group], i),
            None => format!("%{}", self.groups[v.group]),
        }
    }

    fn describe(&self, id: ValueId) -> String {
        format!("{}: {}", self.value_ref(id), self.values[id].ty)
    }

    pub(crate) fn value_types(&self) -> Vec<TensorType> {
        self.values.iter().map(|v| v.ty.clone()).collect()
    }

    pub(crate) fn signature(&self) -> (Vec<TensorType>, Vec<TensorType>) {
        let args = self.blocks[0]
            .args
            .iter()
            .map(|&a| self.values[a].ty.clone())
            .collect();
        let res = self
            .outputs
            .iter()
            .map(|(v, _)| self.values[*v].ty.clone())
            .collect();
        (args, res)
    }
}

/// A handle to a function under construction. Cloning is cheap and yields the same function.
///
/// Functions named `main` are public; every other function is private (a helper reached
/// through [`Func::call`]).
#[derive(Clone)]
pub struct Func {
    pub(crate) st: Rc<RefCell<FuncState>>,
}

impl fmt::Debug for Func {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.st.try_borrow() {
            Ok(s) => write!(f, "Func(@{})", s.name),
            Err(_) => f.write_str("Func(<busy>)"),
        }
    }
}

/// A finished function, ready to be added to a [`super::Module`].
#[derive(Clone)]
pub struct Function {
    pub(crate) st: Rc<RefCell<FuncState>>,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Function(@{})", self.st.borrow().name)
    }
}

impl Function {
    /// The function's name.
    pub fn name(&self) -> String {
        self.st.borrow().name.clone()
    }

    /// The callable signature of this function.
    pub fn callee(&self) -> Callee {
        let st = self.st.borrow();
        let (args, results) = st.signature();
        Callee {
            name: st.name.clone(),
            args,
            results,
        }
    }

    /// Every value type in the function, block arguments of nested regions included.
    pub fn value_types(&self) -> Vec<TensorType> {
        self.st.borrow().value_types()
    }
}

/// The name and signature of a function that other functions may `call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Callee {
    /// Function name (without `@`).
    pub name: String,
    /// Argument types.
    pub args: Vec<TensorType>,
    /// Result types.
    pub results: Vec<TensorType>,
}

/// A typed SSA value of a function under construction.
///
/// Holds a handle to its function, so ops are methods (`x.add(&y)?`). A value may be used
/// in the block that defines it and in regions nested inside that block, except across
/// isolated regions (reduce bodies, sort comparators, manual computations).
#[derive(Clone)]
pub struct Value {
    pub(crate) f: Rc<RefCell<FuncState>>,
    pub(crate) id: ValueId,
    pub(crate) ty: TensorType,
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.f.try_borrow() {
            Ok(s) => write!(f, "Value({})", s.describe(self.id)),
            Err(_) => write!(f, "Value(#{}: {})", self.id, self.ty),
        }
    }
}

impl Value {
    /// The value's tensor type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> super::types::DType {
        self.ty.dtype
    }

    /// The static shape.
    pub fn shape(&self) -> &[i64] {
        &self.ty.shape
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.ty.shape.len()
    }

    /// The function this value belongs to.
    pub fn func(&self) -> Func {
        Func { st: self.f.clone() }
    }

    /// The SSA reference as printed, e.g. `%logits` or `%3#1`.
    pub fn name(&self) -> String {
        self.f.borrow().value_ref(self.id)
    }

    /// Gives the value a readable SSA name (made unique with `_1`, `_2`, ...). For one result
    /// of a multi-result op this names the whole result group (`%name#i`).
    pub fn named(&self, name: &str) -> Value {
        let mut st = self.f.borrow_mut();
        let fresh = st.fresh_name(Some(name));
        let g = st.values[self.id].group;
        st.groups[g] = fresh;
        self.clone()
    }

    pub(crate) fn describe(&self) -> String {
        match self.f.try_borrow() {
            Ok(s) => s.describe(self.id),
            Err(_) => format!("#{}: {}", self.id, self.ty),
        }
    }
}

/// Comma-separated types of `vals`, for error messages and printing.
pub(crate) fn types_of(vals: &[&Value]) -> String {
    vals.iter()
        .map(|v| v.ty.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Func {
    /// Starts a function without a mesh (no sharding annotations allowed).
    pub fn new(name: &str) -> Self {
        Self::build(name, None)
    }

    /// Starts a function whose shardings refer to `mesh`.
    pub fn with_mesh(name: &str, mesh: &Mesh) -> Self {
        Self::build(name, Some(mesh.clone()))
    }

    fn build(name: &str, mesh: Option<Mesh>) -> Self {
        let st = FuncState {
            name: sanitize(name),
            public: name == "main",
            mesh,
            uses_mesh: false,
            values: Vec::new(),
            groups: Vec::new(),
            used: HashSet::new(),
            next_auto: 0,
            blocks: vec![BlockInfo {
                parent: None,
                isolated: true,
                manual: None,
                header: false,
                open: true,
                args: Vec::new(),
                ops: Vec::new(),
            }],
            stack: vec![0],
            arg_shardings: Vec::new(),
            arg_aliases: Vec::new(),
            outputs: Vec::new(),
            calls: Vec::new(),
            next_channel: 1,
            finished: false,
        };
        Func {
            st: Rc::new(RefCell::new(st)),
        }
    }

    /// The function's name.
    pub fn name(&self) -> String {
        self.st.borrow().name.clone()
    }

    /// The mesh this function's shardings refer to, if any.
    pub fn mesh(&self) -> Option<Mesh> {
        self.st.borrow().mesh.clone()
    }

    fn not_finished(&self, st: &FuncState) -> Result<()> {
        if st.finished {
            return Err(HloError::Function {
                func: st.name.clone(),
                reason: "the function is already finished; start a new Func to add ops".into(),
            });
        }
        Ok(())
    }

    /// Adds a named argument; the name becomes its SSA name (`%x`).
    pub fn arg(&self, name: &str, ty: TensorType) -> Result<Value> {
        self.add_arg(name, ty, None, None)
    }

    /// Adds a named argument with a sharding over the function's mesh.
    pub fn arg_sharded(&self, name: &str, ty: TensorType, sharding: &Sharding) -> Result<Value> {
        self.add_arg(name, ty, Some(sharding.clone()), None)
    }

    /// Adds a sharded argument donated to result `output` (`tf.aliasing_output`): the
    /// caller's buffer is consumed and its memory reused for that result, which must have
    /// the same type.
    pub fn arg_donated(
        &self,
        name: &str,
        ty: TensorType,
        sharding: &Sharding,
        output: usize,
    ) -> Result<Value> {
        self.add_arg(name, ty, Some(sharding.clone()), Some(output))
    }

    fn add_arg(
        &self,
        name: &str,
        ty: TensorType,
        sharding: Option<Sharding>,
        alias: Option<usize>,
    ) -> Result<Value> {
        let mut st = self.st.borrow_mut();
        self.not_finished(&st)?;
        if let Some(s) = &sharding {
            let what = format!("argument `{name}` of @{}", st.name);
            let mesh = st.mesh.clone().ok_or_else(|| no_mesh(&what))?;
            s.check(&what, &ty, &mesh)?;
            st.uses_mesh = true;
        }
        let gname = st.fresh_name(Some(name));
        st.groups.push(gname);
        let g = st.groups.len() - 1;
        let id = st.new_value(ty.clone(), g, None, 0);
        st.blocks[0].args.push(id);
        st.arg_shardings.push(sharding);
        st.arg_aliases.push(alias);
        Ok(Value {
            f: self.st.clone(),
            id,
            ty,
        })
    }

    /// Appends a result of the function.
    pub fn output(&self, v: &Value) -> Result<()> {
        self.add_output(v, None)
    }

    /// Appends a result of the function with a sharding over the function's mesh.
    pub fn output_sharded(&self, v: &Value, sharding: &Sharding) -> Result<()> {
        self.add_output(v, Some(sharding.clone()))
    }

    fn add_output(&self, v: &Value, sharding: Option<Sharding>) -> Result<()> {
        self.check_use("return", v)?;
        let mut st = self.st.borrow_mut();
        if st.current() != 0 {
            return Err(HloError::Function {
                func: st.name.clone(),
                reason: "outputs can only be added outside of regions; return values from the region's closure instead".into(),
            });
        }
        if let Some(s) = &sharding {
            let what = format!("output {} of @{}", st.outputs.len(), st.name);
            let mesh = st.mesh.clone().ok_or_else(|| no_mesh(&what))?;
            s.check(&what, &v.ty, &mesh)?;
            st.uses_mesh = true;
        }
        st.outputs.push((v.id, sharding));
        Ok(())
    }

    /// Freezes the function. Values of a finished function can no longer be used in ops.
    pub fn finish(&self) -> Result<Function> {
        let mut st = self.st.borrow_mut();
        self.not_finished(&st)?;
        if st.stack.len() != 1 {
            return Err(HloError::Function {
                func: st.name.clone(),
                reason: "cannot finish while a region is being built; call finish after the closure returns".into(),
            });
        }
        st.finished = true;
        Ok(Function {
            st: self.st.clone(),
        })
    }

    /// Checks that `v` may be used by `op` at the current insertion point.
    pub(crate) fn check_use(&self, op: &str, v: &Value) -> Result<()> {
        let st = self.st.borrow();
        if !Rc::ptr_eq(&self.st, &v.f) {
            let owner = v.f.try_borrow().map(|s| s.name.clone()).unwrap_or_default();
            return Err(HloError::ForeignValue {
                op: op.into(),
                value: v.describe(),
                owner,
                func: st.name.clone(),
            });
        }
        self.not_finished(&st)?;
        let target = st.values[v.id].block;
        let mut b = st.current();
        loop {
            if b == target {
                return Ok(());
            }
            if st.blocks[b].isolated {
                let reason = if !st.blocks[target].open {
                    "it was defined inside a region that is already closed; return it from that region's closure instead"
                } else {
                    "the region being built is isolated from above (reduce body, sort comparator, manual_computation); pass the value in as an operand of that op, or create constants inside the closure"
                };
                return Err(HloError::OutOfScope {
                    op: op.into(),
                    value: st.describe(v.id),
                    reason: reason.into(),
                });
            }
            match st.blocks[b].parent {
                Some(p) => b = p,
                None => {
                    return Err(HloError::OutOfScope {
                        op: op.into(),
                        value: st.describe(v.id),
                        reason: "it was defined inside a region that is already closed; return it from that region's closure instead".into(),
                    })
                }
            }
        }
    }

    /// Appends an op with the given operands (checked), printed pieces and result types.
    pub(crate) fn emit(
        &self,
        op: &str,
        operands: &[&Value],
        pieces: P,
        results: &[TensorType],
    ) -> Result<Vec<Value>> {
        for v in operands {
            self.check_use(op, v)?;
        }
        self.push_op(pieces, results, None)
    }

    /// Like [`Func::emit`] with exactly one result.
    pub(crate) fn emit1(
        &self,
        op: &str,
        operands: &[&Value],
        pieces: P,
        result: TensorType,
    ) -> Result<Value> {
        let mut v = self.emit(op, operands, pieces, std::slice::from_ref(&result))?;
        v.pop().ok_or_else(|| HloError::Function {
            func: self.name(),
            reason: format!("internal: op `{op}` produced no result"),
        })
    }

    fn push_op(&self, pieces: P, results: &[TensorType], hint: Option<&str>) -> Result<Vec<Value>> {
        let mut st = self.st.borrow_mut();
        self.not_finished(&st)?;
        let cur = st.current();
        let mut ids = Vec::with_capacity(results.len());
        if !results.is_empty() {
            let name = st.fresh_name(hint);
            st.groups.push(name);
            let g = st.groups.len() - 1;
            let multi = results.len() > 1;
            for (i, t) in results.iter().enumerate() {
                ids.push(st.new_value(t.clone(), g, multi.then_some(i), cur));
            }
        }
        st.blocks[cur].ops.push(OpRec {
            results: ids.clone(),
            pieces: pieces.0,
        });
        drop(st);
        Ok(ids
            .into_iter()
            .zip(results)
            .map(|(id, t)| Value {
                f: self.st.clone(),
                id,
                ty: t.clone(),
            })
            .collect())
    }

    /// Builds a region: a new block with arguments of `arg_types`, filled by `body`,
    /// ended with `spec.terminator` over the values `body` returns. Returns the block and
    /// the returned values (already checked to be visible in the region).
    ///
    /// Generic over the closure's error type so that callers' own errors pass through
    /// untouched. Whatever `body` returns, the block is closed and the insertion point is
    /// back in the enclosing block afterwards, so the function stays usable after an error.
    pub(crate) fn region<F, E>(
        &self,
        op: &str,
        spec: RegionSpec,
        arg_types: &[TensorType],
        body: F,
    ) -> Result<(BlockId, Vec<Value>), E>
    where
        F: FnOnce(&[Value]) -> Result<Vec<Value>, E>,
        E: From<HloError>,
    {
        let (block, args) = self.open_region(&spec, arg_types)?;
        let out = body(&args).and_then(|vals| self.terminate(op, &spec, vals).map_err(E::from));
        let mut st = self.st.borrow_mut();
        st.stack.pop();
        st.blocks[block].open = false;
        drop(st);
        Ok((block, out?))
    }

    /// Pushes a new block for `spec` with arguments of `arg_types` and makes it the
    /// insertion point.
    fn open_region(
        &self,
        spec: &RegionSpec,
        arg_types: &[TensorType],
    ) -> Result<(BlockId, Vec<Value>)> {
        let mut st = self.st.borrow_mut();
        self.not_finished(&st)?;
        let parent = st.current();
        let manual = spec.manual.or(st.blocks[parent].manual);
        st.blocks.push(BlockInfo {
            parent: Some(parent),
            isolated: spec.isolated,
            manual,
            header: spec.header,
            open: true,
            args: Vec::new(),
            ops: Vec::new(),
        });
        let b = st.blocks.len() - 1;
        let mut args = Vec::with_capacity(arg_types.len());
        for t in arg_types {
            let name = st.fresh_name(None);
            st.groups.push(name);
            let g = st.groups.len() - 1;
            let id = st.new_value(t.clone(), g, None, b);
            st.blocks[b].args.push(id);
            args.push(Value {
                f: self.st.clone(),
                id,
                ty: t.clone(),
            });
        }
        st.stack.push(b);
        Ok((b, args))
    }

    /// Checks that the region's results are visible in it and appends its terminator.
    fn terminate(&self, op: &str, spec: &RegionSpec, vals: Vec<Value>) -> Result<Vec<Value>> {
        let refs: Vec<&Value> = vals.iter().collect();
        for v in &refs {
            self.check_use(op, v)?;
        }
        if spec.terminator.is_empty() {
            return Ok(vals);
        }
        let p = if refs.is_empty() {
            P::new().t(spec.terminator)
        } else {
            P::new()
                .t(format!("{} ", spec.terminator))
                .vs(&refs)
                .t(format!(" : {}", types_of(&refs)))
        };
        self.push_op(p, &[], None)?;
        Ok(vals)
    }

    /// Runs `body` on `inputs` in an isolated block that is printed inline (no region, no
    /// terminator): used for manual computations over a one-device mesh, which XLA does not
    /// partition. The block's arguments print as the inputs; the returned values become
    /// visible in the enclosing block.
    pub(crate) fn inline_region<F, E>(
        &self,
        op: &str,
        manual: i64,
        inputs: &[&Value],
        body: F,
    ) -> Result<Vec<Value>, E>
    where
        F: FnOnce(&[Value]) -> Result<Vec<Value>, E>,
        E: From<HloError>,
    {
        let tys: Vec<TensorType> = inputs.iter().map(|v| v.ty.clone()).collect();
        let spec = RegionSpec {
            isolated: true,
            manual: Some(manual),
            header: false,
            terminator: "",
        };
        let (block, ret) = self.region(op, spec, &tys, |args| {
            {
                let mut st = self.st.borrow_mut();
                for (a, i) in args.iter().zip(inputs) {
                    st.values[a.id].alias = Some(i.id);
                }
            }
            body(args)
        })?;
        let mut st = self.st.borrow_mut();
        let parent = st.current();
        for v in &ret {
            st.values[v.id].block = parent;
        }
        drop(st);
        self.push_op(P(vec![Piece::Inline(block)]), &[], None)?;
        Ok(ret)
    }

    /// The mesh size if the insertion point is inside a manual computation.
    pub(crate) fn manual_size(&self) -> Option<i64> {
        let st = self.st.borrow();
        st.blocks[st.current()].manual
    }

    /// The mesh, or an error naming `what` that needs it; marks the function as using it.
    pub(crate) fn need_mesh(&self, what: &str) -> Result<Mesh> {
        let mut st = self.st.borrow_mut();
        let m = st.mesh.clone().ok_or_else(|| no_mesh(what))?;
        st.uses_mesh = true;
        Ok(m)
    }

    pub(crate) fn next_channel(&self) -> i64 {
        let mut st = self.st.borrow_mut();
        let c = st.next_channel;
        st.next_channel += 1;
        c
    }

    pub(crate) fn record_call(&self, callee: &Callee) {
        self.st.borrow_mut().calls.push(CallRecord {
            callee: callee.clone(),
        });
    }
}

fn no_mesh(what: &str) -> HloError {
    HloError::Sharding {
        what: what.into(),
        reason: "the function has no mesh; create it with Module::func on a module with a mesh, or Func::with_mesh".into(),
    }
}
