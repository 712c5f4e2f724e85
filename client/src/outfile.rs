//! Files that commands write: under a temporary name beside the file the user named, renamed
//! into place once complete, so that a reader never sees half a file; errors name the user's
//! path, never the temporary one.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A new file beside `target`, removed unless renamed into place with [`PartPath::commit`].
pub fn part_file(target: &Path) -> Result<(PartPath, std::io::BufWriter<std::fs::File>)> {
    let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("export");
    let path = dir.join(format!(".{name}.{}.part", std::process::id()));
    let f = std::fs::File::create(&path).with_context(|| format!("cannot write {}", target.display()))?;
    Ok((PartPath { part: path, target: target.to_path_buf() }, std::io::BufWriter::with_capacity(1 << 20, f)))
}

/// The partial file of [`part_file`] and the file it becomes; removed unless committed.
pub struct PartPath {
    part: PathBuf,
    target: PathBuf,
}

impl PartPath {
    /// The temporary file (its size is the file's, before the rename).
    pub fn part(&self) -> &Path {
        &self.part
    }

    /// Renames the partial file into place.
    pub fn commit(self) -> Result<()> {
        std::fs::rename(&self.part, &self.target).with_context(|| format!("cannot write {}", self.target.display()))
    }
}

impl Drop for PartPath {
    fn drop(&mut self) {
        // Already renamed after a commit: nothing left to remove then.
        let _ = std::fs::remove_file(&self.part);
    }
}

/// Writes `data` to `path` (`-`: stdout) through a part file renamed at the end.
pub fn write_file(path: &Path, data: &[u8]) -> Result<()> {
    if path.as_os_str() == "-" {
        let mut out = std::io::stdout().lock();
        return out.write_all(data).and_then(|()| out.flush()).context("writing to stdout");
    }
    let (part, mut file) = part_file(path)?;
    file.write_all(data).and_then(|()| file.flush()).with_context(|| format!("writing {}", path.display()))?;
    drop(file);
    part.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_users_path_and_no_part_file_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir").join("x.json");
        let e = format!("{:#}", write_file(&missing, b"{}").unwrap_err());
        assert!(e.contains(&missing.display().to_string()) && !e.contains(".part"), "{e}");
        let ok = dir.path().join("y.json");
        write_file(&ok, b"{}").unwrap();
        assert_eq!(std::fs::read(&ok).unwrap(), b"{}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["y.json"], "only the file itself is left");
    }
}
