//! Durable metadata for Petrel: an embedded, crash-safe redb database.
//!
//! Every record is a JSON document under a string key in one of a few
//! tables. A write is one redb transaction committed with immediate
//! durability (fsync) before the call that made it returns, so a `kill -9`
//! of the runtime never loses an acknowledged change. Records are small and
//! few (one per pod, container, image and layer); JSON keeps them readable
//! with any redb tool and lets fields be added without migrations
//! (`#[serde(default)]` on new fields).

use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The tables of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// Pod sandboxes, keyed by sandbox id.
    Sandboxes,
    /// Containers, keyed by container id.
    Containers,
    /// Images, keyed by image id (`sha256:<hex>` of the config).
    Images,
    /// Unpacked layers, keyed by diff id.
    Layers,
    /// Cgroup directories the runtime created that outlived the pod that
    /// created them (other pods live below), keyed by directory.
    CgroupDirs,
}

impl Table {
    fn def(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        TableDefinition::new(match self {
            Self::Sandboxes => "sandboxes",
            Self::Containers => "containers",
            Self::Images => "images",
            Self::Layers => "layers",
            Self::CgroupDirs => "cgroup_dirs",
        })
    }

    const ALL: [Table; 5] = [
        Table::Sandboxes,
        Table::Containers,
        Table::Images,
        Table::Layers,
        Table::CgroupDirs,
    ];
}

/// Errors of the metadata store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or created.
    #[error("open store {path}: {source}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// The redb error.
        source: Box<redb::DatabaseError>,
    },
    /// The database file's permissions could not be restricted.
    #[error("chmod {path}: {source}")]
    Io {
        /// The database file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A transaction failed.
    #[error("store transaction: {0}")]
    Transaction(String),
    /// A record could not be encoded or decoded.
    #[error("store record {table:?}/{key}: {source}")]
    Codec {
        /// The table.
        table: Table,
        /// The key.
        key: String,
        /// The JSON error.
        source: serde_json::Error,
    },
}

fn tx<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Transaction(e.to_string())
}

/// The page cache of one database.
const CACHE_BYTES: usize = 4 << 20;

/// One change in an atomic batch (see [`Store::apply`]).
#[derive(Debug)]
pub enum Op {
    /// Insert or replace a record (already encoded with [`encode`]).
    Put(Table, String, Vec<u8>),
    /// Delete a record; deleting a missing key is not an error.
    Delete(Table, String),
}

/// Encodes a record for an [`Op::Put`].
pub fn encode<T: Serialize>(table: Table, key: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Codec {
        table,
        key: key.to_string(),
        source,
    })
}

/// Every record of a table: each key with its decoded record, or the
/// decoding error of that one record.
pub type Listing<T> = Vec<(String, Result<T, StoreError>)>;

/// The metadata database.
#[derive(Debug)]
pub struct Store {
    db: Database,
    /// Scripted write failures (tests of callers' rollbacks).
    #[cfg(feature = "fault-injection")]
    faults: std::sync::Mutex<WriteFaults>,
}

/// Writes to let through, then writes to fail.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Default)]
struct WriteFaults {
    pass: usize,
    fail: usize,
}

impl Store {
    /// Opens (or creates) the database at `path` and makes sure every table
    /// exists, so readers never see a missing table.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // Records are few and small; a bounded cache keeps the daemons'
        // memory flat however many objects come and go (redb's default cache
        // grows to 1 GiB).
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(path)
            .map_err(|source| StoreError::Open {
                path: path.to_path_buf(),
                source: Box::new(source),
            })?;
        // Records hold pod and container configs (environment variables may
        // carry secrets): owner-only, whatever the umask.
        let private = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o600);
        std::fs::set_permissions(path, private).map_err(|source| StoreError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let w = db.begin_write().map_err(tx)?;
        for t in Table::ALL {
            w.open_table(t.def()).map_err(tx)?;
        }
        w.commit().map_err(tx)?;
        Ok(Self {
            db,
            #[cfg(feature = "fault-injection")]
            faults: Default::default(),
        })
    }

    /// Lets the next `pass` writes through, then fails the `fail` after
    /// them with a transaction error (feature `fault-injection`, for tests
    /// of what callers do when the store refuses a write).
    #[cfg(feature = "fault-injection")]
    pub fn fail_writes(&self, pass: usize, fail: usize) {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = WriteFaults { pass, fail };
    }

    /// Inserts or replaces one record, durably.
    pub fn put<T: Serialize>(&self, table: Table, key: &str, value: &T) -> Result<(), StoreError> {
        let bytes = encode(table, key, value)?;
        self.apply(vec![Op::Put(table, key.to_string(), bytes)])
    }

    /// Deletes one record, durably. Deleting a missing key is not an error.
    pub fn delete(&self, table: Table, key: &str) -> Result<(), StoreError> {
        self.apply(vec![Op::Delete(table, key.to_string())])
    }

    /// Inserts or replaces one record without waiting for the disk: the
    /// change is visible at once and becomes durable with the next durable
    /// write (or is lost by a crash before it). For intent records whose loss
    /// recovery can tolerate, on paths where an fsync matters.
    pub fn put_unsynced<T: Serialize>(
        &self,
        table: Table,
        key: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        let bytes = encode(table, key, value)?;
        self.apply_with(
            vec![Op::Put(table, key.to_string(), bytes)],
            Durability::None,
        )
    }

    /// Applies several changes in one transaction: all or none, durably.
    pub fn apply(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        self.apply_with(ops, Durability::Immediate)
    }

    fn apply_with(&self, ops: Vec<Op>, durability: Durability) -> Result<(), StoreError> {
        #[cfg(feature = "fault-injection")]
        {
            let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
            if f.pass > 0 {
                f.pass -= 1;
            } else if f.fail > 0 {
                f.fail -= 1;
                return Err(StoreError::Transaction(
                    "injected write failure".to_string(),
                ));
            }
        }
        let mut w = self.db.begin_write().map_err(tx)?;
        w.set_durability(durability);
        {
            for op in &ops {
                match op {
                    Op::Put(t, k, v) => {
                        let mut table = w.open_table(t.def()).map_err(tx)?;
                        table.insert(k.as_str(), v.as_slice()).map_err(tx)?;
                    }
                    Op::Delete(t, k) => {
                        let mut table = w.open_table(t.def()).map_err(tx)?;
                        table.remove(k.as_str()).map_err(tx)?;
                    }
                }
            }
        }
        w.commit().map_err(tx)
    }

    /// Reads one record.
    pub fn get<T: DeserializeOwned>(
        &self,
        table: Table,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let r = self.db.begin_read().map_err(tx)?;
        let t = r.open_table(table.def()).map_err(tx)?;
        let Some(v) = t.get(key).map_err(tx)? else {
            return Ok(None);
        };
        serde_json::from_slice(v.value())
            .map(Some)
            .map_err(|source| StoreError::Codec {
                table,
                key: key.to_string(),
                source,
            })
    }

    /// Reads every record of a table, in key order. A record that cannot be
    /// decoded is returned as an error for that key rather than failing the
    /// whole listing, so start-up can report it and carry on.
    pub fn list<T: DeserializeOwned>(&self, table: Table) -> Result<Listing<T>, StoreError> {
        let r = self.db.begin_read().map_err(tx)?;
        let t = r.open_table(table.def()).map_err(tx)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(tx)? {
            let (k, v) = item.map_err(tx)?;
            let key = k.value().to_string();
            let rec = serde_json::from_slice(v.value()).map_err(|source| StoreError::Codec {
                table,
                key: key.clone(),
                source,
            });
            out.push((key, rec));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Rec {
        name: String,
        n: u32,
    }

    #[test]
    fn store_should_persist_across_reopen() -> Result<(), StoreError> {
        let dir = tempfile::tempdir().map_err(tx)?;
        let path = dir.path().join("meta.redb");
        {
            let s = Store::open(&path)?;
            s.put(
                Table::Containers,
                "a",
                &Rec {
                    name: "x".into(),
                    n: 1,
                },
            )?;
            s.put(
                Table::Containers,
                "b",
                &Rec {
                    name: "y".into(),
                    n: 2,
                },
            )?;
            s.delete(Table::Containers, "b")?;
            s.delete(Table::Containers, "missing")?;
        }
        let s = Store::open(&path)?;
        let got: Option<Rec> = s.get(Table::Containers, "a")?;
        assert_eq!(
            got,
            Some(Rec {
                name: "x".into(),
                n: 1
            })
        );
        let all = s.list::<Rec>(Table::Containers)?;
        assert_eq!(all.len(), 1);
        assert!(s.get::<Rec>(Table::Sandboxes, "a")?.is_none());
        Ok(())
    }

    #[test]
    fn unsynced_puts_should_become_durable_with_the_next_durable_write() -> Result<(), StoreError> {
        let dir = tempfile::tempdir().map_err(tx)?;
        let path = dir.path().join("meta.redb");
        {
            let s = Store::open(&path)?;
            s.put_unsynced(
                Table::Containers,
                "intent",
                &Rec {
                    name: "i".into(),
                    n: 1,
                },
            )?;
            assert!(s.get::<Rec>(Table::Containers, "intent")?.is_some());
            s.put(
                Table::Sandboxes,
                "other",
                &Rec {
                    name: "o".into(),
                    n: 2,
                },
            )?;
        }
        let s = Store::open(&path)?;
        assert!(s.get::<Rec>(Table::Containers, "intent")?.is_some());
        Ok(())
    }

    #[test]
    fn store_apply_should_be_atomic_across_tables() -> Result<(), StoreError> {
        let dir = tempfile::tempdir().map_err(tx)?;
        let s = Store::open(&dir.path().join("meta.redb"))?;
        let r = Rec {
            name: "p".into(),
            n: 3,
        };
        s.apply(vec![
            Op::Put(
                Table::Sandboxes,
                "p".into(),
                encode(Table::Sandboxes, "p", &r)?,
            ),
            Op::Put(
                Table::Containers,
                "c".into(),
                encode(Table::Containers, "c", &r)?,
            ),
        ])?;
        assert!(s.get::<Rec>(Table::Sandboxes, "p")?.is_some());
        assert!(s.get::<Rec>(Table::Containers, "c")?.is_some());
        Ok(())
    }

    #[test]
    fn store_list_should_report_undecodable_records_individually() -> Result<(), StoreError> {
        let dir = tempfile::tempdir().map_err(tx)?;
        let s = Store::open(&dir.path().join("meta.redb"))?;
        s.apply(vec![Op::Put(
            Table::Images,
            "bad".into(),
            b"{not json".to_vec(),
        )])?;
        s.put(
            Table::Images,
            "good",
            &Rec {
                name: "g".into(),
                n: 0,
            },
        )?;
        let all = s.list::<Rec>(Table::Images)?;
        assert_eq!(all.len(), 2);
        assert!(all.iter().any(|(k, r)| k == "bad" && r.is_err()));
        assert!(all.iter().any(|(k, r)| k == "good" && r.is_ok()));
        Ok(())
    }
}
