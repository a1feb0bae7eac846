//! Child processes that end with the run: the two system calls `std::process` does not
//! offer, behind safe functions (this crate is the project's FFI layer).

use std::process::Command;

/// Makes the program `command` starts receive SIGKILL when the thread that started it
/// ends (Linux's parent-death signal), so a user's program never outlives a run that was
/// killed outright (SIGKILL, or a second Ctrl-C) and could not end it. Start it from a
/// thread that lives as long as the run. Elsewhere than Linux this does nothing.
pub fn end_with_parent(command: &mut Command) -> &mut Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the forked child before exec and only calls prctl,
        // which is async-signal-safe, with constant arguments; it allocates nothing.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    command
}

/// Sends SIGKILL to every process of the process group `group` (a child started with
/// `process_group(0)`: its id is the group's). Call it before reaping the leader, whose
/// unreaped id keeps the group id from being reused.
pub fn kill_group(group: u32) -> std::io::Result<()> {
    let pgid = libc::pid_t::try_from(group)
        .map_err(|_| std::io::Error::other(format!("process group {group} is out of range")))?;
    if pgid <= 0 {
        return Err(std::io::Error::other(format!(
            "process group {group} would signal more than one group"
        )));
    }
    // SAFETY: killpg takes plain integers; a positive group id signals only that group.
    if unsafe { libc::killpg(pgid, libc::SIGKILL) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
