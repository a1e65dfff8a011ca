//! Property test of the benign side: random well-formed layers (with
//! repeated names, replacements of every kind, hard links to files and
//! symlinks) unpack to exactly the tree a plain model predicts, so the
//! containment rules never cost a legitimate layer anything.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use proptest::prelude::*;

use super::{list_tree, tag, Sandbox, E};

#[derive(Clone, Debug, PartialEq)]
enum Node {
    Dir,
    /// Content tag and inode id (shared by hard links).
    File(String, usize),
    Sym(String, usize),
}

#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
    next_id: usize,
}

impl Model {
    fn remove_tree(&mut self, p: &str) {
        let below = format!("{p}/");
        self.nodes.retain(|k, _| k != p && !k.starts_with(&below));
    }

    fn id(&mut self) -> usize {
        self.next_id += 1;
        self.next_id
    }

    /// Applies entry `i`, or returns false for one a layer writer would
    /// never produce (below a non-directory, a link to nothing), which the
    /// test leaves out of the archive.
    fn apply(&mut self, i: usize, e: &E) -> bool {
        let name = e.name().trim_end_matches('/');
        let comps: Vec<&str> = name.split('/').collect();
        for k in 1..comps.len() {
            match self.nodes.get(&comps[..k].join("/")) {
                None | Some(Node::Dir) => {}
                Some(_) => return false,
            }
        }
        let node = match e {
            E::Dir(_) => {
                if self.nodes.get(name) == Some(&Node::Dir) {
                    return true;
                }
                Node::Dir
            }
            E::File(_) => Node::File(tag(i), self.id()),
            E::Sym(_, t) => Node::Sym(t.clone(), self.id()),
            E::Hard(_, t) => match self.nodes.get(t.as_str()) {
                Some(n @ (Node::File(..) | Node::Sym(..))) if t != name => {
                    if t.starts_with(&format!("{name}/")) {
                        return false;
                    }
                    n.clone()
                }
                _ => return false,
            },
            E::Fifo(_) => return false,
        };
        for k in 1..comps.len() {
            self.nodes.insert(comps[..k].join("/"), Node::Dir);
        }
        self.remove_tree(name);
        self.nodes.insert(name.to_string(), node);
        true
    }
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 1..4)
        .prop_map(|c| c.join("/"))
}

fn benign_entry() -> impl Strategy<Value = E> {
    prop_oneof![
        2 => path().prop_map(|p| E::Dir(format!("{p}/"))),
        3 => path().prop_map(E::File),
        // Symlink values may point anywhere: they are never followed.
        2 => (path(), prop_oneof![path(), Just("/etc/passwd".to_string()), Just("../..".to_string())])
            .prop_map(|(p, t)| E::Sym(p, t)),
        2 => (path(), path()).prop_map(|(p, t)| E::Hard(p, t)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn benign_layers_should_unpack_to_the_modelled_tree(
        raw in prop::collection::vec(benign_entry(), 1..20)
    ) {
        let mut model = Model::default();
        let mut entries = Vec::new();
        for e in raw {
            // Indices are positions in the final archive (file tags).
            if model.apply(entries.len(), &e) {
                entries.push(e);
            }
        }
        let sb = Sandbox::new();
        sb.run_and_check(&entries).expect("a benign layer unpacks");
        let mut found = Vec::new();
        list_tree(&sb.root(), "", &mut found);
        let got: BTreeMap<String, std::fs::Metadata> = found.into_iter().collect();
        prop_assert_eq!(
            got.keys().collect::<Vec<_>>(),
            model.nodes.keys().collect::<Vec<_>>(),
            "{:?}", entries
        );
        let mut inodes: BTreeMap<usize, u64> = BTreeMap::new();
        for (p, n) in &model.nodes {
            let m = &got[p];
            let full = sb.root().join(p);
            match n {
                Node::Dir => prop_assert!(m.is_dir(), "{}", p),
                Node::File(t, id) => {
                    prop_assert!(m.is_file(), "{}", p);
                    prop_assert_eq!(std::fs::read(&full).expect("read"), t.as_bytes());
                    prop_assert_eq!(*inodes.entry(*id).or_insert(m.ino()), m.ino(), "{}", p);
                }
                Node::Sym(t, id) => {
                    prop_assert!(m.file_type().is_symlink(), "{}", p);
                    prop_assert_eq!(
                        std::fs::read_link(&full).expect("readlink").display().to_string(),
                        t.clone()
                    );
                    prop_assert_eq!(*inodes.entry(*id).or_insert(m.ino()), m.ino(), "{}", p);
                }
            }
        }
        // Distinct model inodes are distinct real inodes.
        let mut seen: Vec<u64> = inodes.values().copied().collect();
        seen.sort_unstable();
        seen.dedup();
        prop_assert_eq!(seen.len(), inodes.len());
    }
}
