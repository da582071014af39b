//! What to tell a user an instance's files refuse: whose files they are, and how to read them.

use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use hvstats::attach::AttachError;
use hvstats::publish::{ARENA_SUFFIX, GLOBAL_SUFFIX};
use hvstats::runtime_dir::RuntimeDirError;

/// For a problem that is this user being refused an instance's `.arena` or `.global` file: which
/// instance's file it is, who may read it, and how to get access. `None` for any other problem.
pub(crate) fn arena_access(problem: &AttachError) -> Option<String> {
    let path = match problem {
        AttachError::Dir(RuntimeDirError::Io { path, source, .. }) | AttachError::Page { path, source }
            if source.kind() == ErrorKind::PermissionDenied =>
        {
            path
        }
        _ => return None,
    };
    let file = path.file_name()?.to_str()?;
    let what = match (file.strip_suffix(ARENA_SUFFIX), file.strip_suffix(GLOBAL_SUFFIX)) {
        (Some(instance), _) => format!("the arena of instance {instance} (its partitions' and VPs' pages)"),
        (_, Some(instance)) => format!("the global pages of instance {instance} (hypervisor and LPs)"),
        _ => return None,
    };
    // The directory lets anyone look the file up: its owner and mode say who may read it.
    let meta = std::fs::metadata(path).ok()?;
    let owner = name_in("/etc/passwd", meta.uid());
    let group = name_in("/etc/group", meta.gid());
    let readers = match meta.mode() & 0o040 != 0 {
        true => format!("its owner {owner} and group {group} may read (mode {:04o})", meta.mode() & 0o7777),
        false => format!("only its owner {owner} may read (mode {:04o})", meta.mode() & 0o7777),
    };
    let as_owner = if meta.uid() == 0 { String::new() } else { format!(" or as {owner}") };
    let member =
        if meta.mode() & 0o040 != 0 { format!(", or as a member of group {group}") } else { String::new() };
    Some(format!(
        "{} is {what}, which {readers}: run this as root (sudo){as_owner}{member}; without root, \
         `hvstats serve --socket-group GROUP` lets that group's members read the same counters \
         through its socket (docs/surfaces.md, \"Who may read\")",
        path.display()
    ))
}

/// The name `/etc/passwd` or `/etc/group` (`table`) gives the id `id` (its third field), or the
/// number when it names none.
fn name_in(table: &str, id: u32) -> String {
    let text = std::fs::read_to_string(Path::new(table)).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split(':').collect();
            (fields.get(2)?.parse::<u32>().ok()? == id).then(|| fields[0].to_owned())
        })
        .unwrap_or_else(|| id.to_string())
}
