//! The table of docs/SECCOMP.md, written from the allow-lists.

use super::table::{role_bit, Args, ALL, ALLOWED, DAEMON};
use super::ThreadRole;

/// The table of docs/SECCOMP.md: system call | roles | why.
pub fn markdown_table() -> String {
    let mut out = String::from("| system call | roles | why |\n| --- | --- | --- |\n");
    for a in ALLOWED {
        // The launcher's list is the union of the others': not a column of its own.
        let roles: Vec<String> = ThreadRole::ALL
            .iter()
            .filter(|&&r| r != ThreadRole::Launcher && a.roles & role_bit(r) != 0)
            .map(|r| format!("{r:?}"))
            .collect();
        let args = match a.args {
            Args::Any => String::new(),
            Args::Thread => " (CLONE_THREAD only)".to_string(),
            Args::NoExec => " (no PROT_EXEC)".to_string(),
            Args::Prctl(o) => format!(" ({} only)", prctl_names(o)),
            Args::Fcntl(c) => format!(" ({} only)", fcntl_names(c)),
            Args::SetModeFilter => " (SECCOMP_SET_MODE_FILTER, no flags)".to_string(),
            Args::OwnThreads(s) => format!(
                " (own process, {} only)",
                s.iter()
                    .map(|&s| signal_name(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        out.push_str(&format!(
            "| `{}`{args} | {} | {} |\n",
            a.name.trim_start_matches("SYS_"),
            if a.roles == ALL {
                "all".to_string()
            } else if a.roles == DAEMON {
                "all but Supervisor".to_string()
            } else {
                roles.join(", ")
            },
            a.why
        ));
    }
    out
}

fn prctl_names(options: &[i32]) -> String {
    options
        .iter()
        .map(|&o| match o {
            libc::PR_SET_NAME => "PR_SET_NAME".to_string(),
            libc::PR_GET_NAME => "PR_GET_NAME".to_string(),
            libc::PR_SET_NO_NEW_PRIVS => "PR_SET_NO_NEW_PRIVS".to_string(),
            o => o.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn fcntl_names(cmds: &[i32]) -> String {
    cmds.iter()
        .map(|&c| match c {
            libc::F_GETFL => "F_GETFL".to_string(),
            libc::F_SETFL => "F_SETFL".to_string(),
            libc::F_GETFD => "F_GETFD".to_string(),
            libc::F_SETFD => "F_SETFD".to_string(),
            libc::F_DUPFD_CLOEXEC => "F_DUPFD_CLOEXEC".to_string(),
            libc::F_OFD_GETLK => "F_OFD_GETLK".to_string(),
            libc::F_OFD_SETLK => "F_OFD_SETLK".to_string(),
            libc::F_OFD_SETLKW => "F_OFD_SETLKW".to_string(),
            libc::F_GETLK => "F_GETLK".to_string(),
            libc::F_SETLK => "F_SETLK".to_string(),
            libc::F_SETLKW => "F_SETLKW".to_string(),
            c => c.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGABRT => "SIGABRT",
        _ => "?",
    }
}
