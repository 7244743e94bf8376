//! Records the git commit FORGE is built from, for `forge_build_info{git_sha}`: `FORGE_GIT_SHA`
//! from the build's environment if set, else the commit of a published package
//! (`.cargo_vcs_info.json`), else `git rev-parse HEAD` when this crate is tracked by the
//! checkout it is in, else `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=FORGE_GIT_SHA");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let sha = std::env::var("FORGE_GIT_SHA")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| published(&dir))
        .or_else(|| checkout(&dir))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=FORGE_GIT_SHA={}", sha.trim());
}

/// The commit cargo recorded when the package was published.
fn published(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string(dir.join(".cargo_vcs_info.json")).ok()?;
    let at = info.find("\"sha1\"")?;
    let rest = &info[at + "\"sha1\"".len()..];
    let start = rest.find('"')? + 1;
    let end = start + rest[start..].find('"')?;
    Some(rest[start..end].to_owned())
}

/// `HEAD` of the git checkout this crate is tracked in (not of a repository it merely sits
/// in, such as a home directory under version control).
fn checkout(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    git(&["ls-files", "--error-unmatch", "Cargo.toml"])?;
    let sha = git(&["rev-parse", "HEAD"])?;
    // Build again when HEAD moves: a commit, a checkout.
    if let (Some(git_dir), Some(common)) = (
        git(&["rev-parse", "--absolute-git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) {
        let git_dir = PathBuf::from(git_dir);
        let common = dir.join(common);
        let head = git_dir.join("HEAD");
        let mut watched = vec![head.clone(), common.join("packed-refs")];
        if let Ok(text) = std::fs::read_to_string(&head)
            && let Some(reference) = text.trim().strip_prefix("ref: ")
        {
            watched.push(common.join(reference));
        }
        for path in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Some(sha)
}
