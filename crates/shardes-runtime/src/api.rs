//! The PJRT call machinery: a plugin's function table ([`Api`]), the macros that fill in
//! argument structs and call table entries, turning a returned `PJRT_Error*` into a
//! [`RuntimeError`], awaiting events, and reading C strings.
//!
//! This layer knows only the bindings and the error type, so every owner of a C handle
//! (plugin, client, buffer, executable) can use it without importing the others.

use crate::error::{Result, RuntimeError};
use crate::ffi;

/// A plugin's `PJRT_Api` function table and how much of it the plugin provides.
///
/// The table is static data inside the plugin library, which is never unloaded (see
/// [`crate::Plugin`]), so the pointer stays valid for the rest of the process.
pub(crate) struct Api {
    table: *const ffi::PJRT_Api,
    struct_size: usize,
}

// SAFETY: the table is immutable after `GetPjrtApi` and the PJRT C API is thread-safe by
// contract (XLA's clients are used from many threads by JAX).
unsafe impl Send for Api {}
// SAFETY: as above; `&Api` only reads the table and makes thread-safe C calls.
unsafe impl Sync for Api {}

/// Something that can hand out a plugin's [`Api`]: what [`pjrt_call!`] accepts.
pub(crate) trait HasApi {
    /// The function table to call through.
    fn pjrt_api(&self) -> &Api;
}

impl HasApi for Api {
    fn pjrt_api(&self) -> &Api {
        self
    }
}

/// Calls a function from a plugin's `PJRT_Api` table.
///
/// `$plugin` is anything implementing [`HasApi`] (a `&Plugin` or an `&Api`). Resolves to
/// `Err(RuntimeError::Unsupported)` when the plugin's table is too short to contain the entry
/// (older plugin) or the entry is null, and converts a returned `PJRT_Error*` into a
/// [`RuntimeError::Pjrt`]. Must be used inside an `unsafe` block: the caller vouches that `args`
/// is a correctly initialised argument struct for that function.
macro_rules! pjrt_call {
    ($plugin:expr, $name:ident, $args:expr) => {{
        let api: &$crate::api::Api = $crate::api::HasApi::pjrt_api($plugin);
        match api.function_available(
            ::std::mem::offset_of!($crate::ffi::PJRT_Api, $name),
            ::std::mem::size_of::<$crate::ffi::$name>(),
        ) {
            false => Err($crate::error::RuntimeError::Unsupported {
                function: stringify!($name),
            }),
            true => match (*api.table()).$name {
                None => Err($crate::error::RuntimeError::Unsupported {
                    function: stringify!($name),
                }),
                Some(f) => api.check(f($args)),
            },
        }
    }};
}
pub(crate) use pjrt_call;

/// Creates a zeroed C argument struct with its `struct_size` set, as the C API requires.
macro_rules! pjrt_args {
    ($ty:ident) => {{
        // SAFETY: every PJRT args struct is plain old data (integers, pointers, nullable
        // function pointers); the all-zero pattern is its documented default.
        // (The block is redundant when the macro is used inside another `unsafe` block.)
        #[allow(unused_unsafe)]
        let mut a: $crate::ffi::$ty = unsafe { ::std::mem::zeroed() };
        // The header's size (offset + size of the last field) is what plugins compare against
        // to learn which fields the caller knows about.
        a.struct_size = ::paste::paste!($crate::ffi::[<$ty _STRUCT_SIZE>]) as usize;
        a
    }};
}
pub(crate) use pjrt_args;

impl Api {
    /// Wraps the table returned by `GetPjrtApi`.
    ///
    /// # Safety
    /// `table` must be non-null and point to a `PJRT_Api` that stays valid (and unchanged)
    /// for the rest of the process, whose first `struct_size` bytes are readable.
    pub(crate) unsafe fn new(table: *const ffi::PJRT_Api, struct_size: usize) -> Api {
        Api { table, struct_size }
    }

    /// The raw table (valid for the rest of the process).
    pub(crate) fn table(&self) -> *const ffi::PJRT_Api {
        self.table
    }

    /// Whether the table entry at `offset` (of `size` bytes) lies within the plugin's table.
    pub(crate) fn function_available(&self, offset: usize, size: usize) -> bool {
        offset + size <= self.struct_size
    }

    /// Converts a `PJRT_Error*` into a `Result`, destroying the error.
    pub(crate) fn check(&self, err: *mut ffi::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut msg = pjrt_args!(PJRT_Error_Message_Args);
        msg.error = err;
        let mut code = pjrt_args!(PJRT_Error_GetCode_Args);
        code.error = err;
        // SAFETY: `err` is a live error object returned by this plugin; the message pointer
        // is valid until the error is destroyed, which happens last.
        unsafe {
            let api = &*self.table;
            let message = match api.PJRT_Error_Message {
                Some(f) => {
                    f(&mut msg);
                    lossy(msg.message, msg.message_size)
                }
                None => String::from("(plugin offers no error message)"),
            };
            let code_name = match api.PJRT_Error_GetCode {
                Some(f) if f(&mut code).is_null() => code_name(code.code),
                _ => "UNKNOWN".to_string(),
            };
            if let Some(destroy) = api.PJRT_Error_Destroy {
                let mut d = pjrt_args!(PJRT_Error_Destroy_Args);
                d.error = err;
                destroy(&mut d);
            }
            Err(RuntimeError::Pjrt {
                code: code_name,
                message,
            })
        }
    }

    /// Waits for `event` (if non-null), destroys it, and returns its status.
    pub(crate) fn await_event(&self, event: *mut ffi::PJRT_Event) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = pjrt_args!(PJRT_Event_Await_Args);
        a.event = event;
        // SAFETY: `event` is a live event owned by us; it is destroyed exactly once below.
        let status = unsafe { pjrt_call!(self, PJRT_Event_Await, &mut a) };
        let mut d = pjrt_args!(PJRT_Event_Destroy_Args);
        d.event = event;
        // SAFETY: as above.
        let destroyed = unsafe { pjrt_call!(self, PJRT_Event_Destroy, &mut d) };
        status.and(destroyed)
    }
}

/// Copies a (pointer, length) C string into a `String`, replacing invalid UTF-8.
///
/// # Safety
/// `p` must be null or valid for `len` bytes.
pub(crate) unsafe fn lossy(p: *const std::os::raw::c_char, len: usize) -> String {
    if p.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

fn code_name(code: ffi::PJRT_Error_Code) -> String {
    let name = match code {
        ffi::PJRT_Error_Code_CANCELLED => "CANCELLED",
        ffi::PJRT_Error_Code_UNKNOWN => "UNKNOWN",
        ffi::PJRT_Error_Code_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        ffi::PJRT_Error_Code_DEADLINE_EXCEEDED => "DEADLINE_EXCEEDED",
        ffi::PJRT_Error_Code_NOT_FOUND => "NOT_FOUND",
        ffi::PJRT_Error_Code_ALREADY_EXISTS => "ALREADY_EXISTS",
        ffi::PJRT_Error_Code_PERMISSION_DENIED => "PERMISSION_DENIED",
        ffi::PJRT_Error_Code_RESOURCE_EXHAUSTED => "RESOURCE_EXHAUSTED",
        ffi::PJRT_Error_Code_FAILED_PRECONDITION => "FAILED_PRECONDITION",
        ffi::PJRT_Error_Code_ABORTED => "ABORTED",
        ffi::PJRT_Error_Code_OUT_OF_RANGE => "OUT_OF_RANGE",
        ffi::PJRT_Error_Code_UNIMPLEMENTED => "UNIMPLEMENTED",
        ffi::PJRT_Error_Code_INTERNAL => "INTERNAL",
        ffi::PJRT_Error_Code_UNAVAILABLE => "UNAVAILABLE",
        ffi::PJRT_Error_Code_DATA_LOSS => "DATA_LOSS",
        ffi::PJRT_Error_Code_UNAUTHENTICATED => "UNAUTHENTICATED",
        other => return format!("code {other}"),
    };
    name.to_string()
}
