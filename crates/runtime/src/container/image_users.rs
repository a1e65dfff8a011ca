//! The user and group databases (`/etc/passwd`, `/etc/group`) of images, read
//! once from the first container of each image.
//!
//! A new container's rootfs is its image's layers under an empty writable layer,
//! so its databases are the image's. Known without mounting, they let
//! CreateContainer build the spec, and ask the NRI plugins about it, while the
//! rootfs is being mounted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use petrel_oci::user::UserDb;

/// Images remembered at most; past that the cache starts over (an entry costs
/// one read of two files to make again).
const CAPACITY: usize = 256;

/// Image id → its user and group databases.
#[derive(Debug, Default)]
pub struct ImageUsers {
    dbs: Mutex<HashMap<String, Arc<UserDb>>>,
}

impl ImageUsers {
    /// The databases of `image_id`, if read before.
    pub fn get(&self, image_id: &str) -> Option<Arc<UserDb>> {
        self.dbs.lock().ok()?.get(image_id).cloned()
    }

    /// Remembers the databases read from a new container of `image_id`.
    pub fn insert(&self, image_id: &str, db: Arc<UserDb>) {
        if image_id.is_empty() {
            return;
        }
        if let Ok(mut dbs) = self.dbs.lock() {
            if dbs.len() >= CAPACITY && !dbs.contains_key(image_id) {
                dbs.clear();
            }
            dbs.insert(image_id.to_string(), db);
        }
    }

    /// Forgets a removed image.
    pub fn remove(&self, image_id: &str) {
        if let Ok(mut dbs) = self.dbs.lock() {
            dbs.remove(image_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn should_remember_images_and_start_over_when_full() {
        let users = ImageUsers::default();
        let db = Arc::new(UserDb::from_contents(
            Some("app:x:1000:1000::/:/bin/sh\n"),
            None,
        ));
        assert!(users.get("sha256:a").is_none());
        users.insert("sha256:a", db.clone());
        assert_eq!(users.get("sha256:a").as_deref(), Some(&*db));
        users.insert("", db.clone());
        assert!(users.get("").is_none());
        for i in 0..CAPACITY {
            users.insert(&format!("sha256:{i}"), db.clone());
        }
        assert!(users.dbs.lock().map(|d| d.len()).unwrap_or(0) <= CAPACITY);
        users.remove("sha256:0");
        assert!(users.get("sha256:0").is_none());
    }
}
