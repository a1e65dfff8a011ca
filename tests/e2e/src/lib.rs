//! Petrel's end-to-end suite: the tests are in `tests/*.rs`, their support
//! in the `petrel-testkit` crate. They run the `petrel` and `petrel-shim`
//! binaries of the same cargo target directory (`make test` builds them
//! first; `cargo build -p petrel` by hand), as root, each test with its own
//! temporary root, socket, ports, cgroup parent, network and names.
