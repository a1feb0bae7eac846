//! A device's allocator statistics (`PJRT_Device_MemoryStats`), where the plugin offers
//! them.
//!
//! Every field but the bytes in use is optional in the C API (an `_is_set` flag beside it),
//! so each is an `Option` here; a plugin that does not implement the call at all (the CPU
//! plugin answers `UNIMPLEMENTED`) gives `Ok(None)` from [`Client::device_memory_stats`],
//! which is not an error: the statistics are a diagnostic.

use crate::api::{pjrt_args, pjrt_call};
use crate::client::Client;
use crate::error::{Result, RuntimeError};

/// One device's allocator statistics, in bytes (counts for `num_allocs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeviceMemoryStats {
    /// Bytes allocated now.
    pub bytes_in_use: i64,
    /// The most bytes allocated at once so far.
    pub peak_bytes_in_use: Option<i64>,
    /// Allocations made so far.
    pub num_allocs: Option<i64>,
    /// The largest single allocation so far.
    pub largest_alloc_size: Option<i64>,
    /// What the allocator may hand out in total.
    pub bytes_limit: Option<i64>,
    /// Bytes reserved from the system.
    pub bytes_reserved: Option<i64>,
    /// The most bytes reserved at once so far.
    pub peak_bytes_reserved: Option<i64>,
}

fn set(value: i64, is_set: bool) -> Option<i64> {
    is_set.then_some(value)
}

impl Client {
    /// Device `device`'s allocator statistics, or `None` where the plugin does not offer
    /// them (the function is missing from its table or answers `UNIMPLEMENTED`).
    pub fn device_memory_stats(&self, device: usize) -> Result<Option<DeviceMemoryStats>> {
        let inner = &self.inner;
        let dev = *inner
            .devices
            .get(device)
            .ok_or(RuntimeError::NoSuchDevice {
                device,
                count: inner.devices.len(),
            })?;
        let mut a = pjrt_args!(PJRT_Device_MemoryStats_Args);
        a.device = dev;
        // SAFETY: `dev` is a live device handle owned by the client `inner` keeps alive; the
        // plugin writes only the integer and flag fields of `a`.
        let called = unsafe { pjrt_call!(&*inner.plugin, PJRT_Device_MemoryStats, &mut a) };
        match called {
            Ok(()) => Ok(Some(DeviceMemoryStats {
                bytes_in_use: a.bytes_in_use,
                peak_bytes_in_use: set(a.peak_bytes_in_use, a.peak_bytes_in_use_is_set),
                num_allocs: set(a.num_allocs, a.num_allocs_is_set),
                largest_alloc_size: set(a.largest_alloc_size, a.largest_alloc_size_is_set),
                bytes_limit: set(a.bytes_limit, a.bytes_limit_is_set),
                bytes_reserved: set(a.bytes_reserved, a.bytes_reserved_is_set),
                peak_bytes_reserved: set(a.peak_bytes_reserved, a.peak_bytes_reserved_is_set),
            })),
            Err(RuntimeError::Unsupported { .. }) => Ok(None),
            Err(RuntimeError::Pjrt { code, .. }) if code == "UNIMPLEMENTED" => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_a_missing_device_are_an_error_and_of_a_real_one_a_result() {
        let client = match Client::cpu(2) {
            Ok(c) => c,
            // No plugin on this machine: the client tests of this crate say so already.
            Err(_) => return,
        };
        assert!(matches!(
            client.device_memory_stats(2),
            Err(RuntimeError::NoSuchDevice {
                device: 2,
                count: 2
            })
        ));
        // Offered or not, asking device 0 must not fail.
        let stats = client
            .device_memory_stats(0)
            .expect("device 0's statistics");
        if let Some(s) = stats {
            assert!(s.bytes_in_use >= 0);
        }
    }
}
