pub mod node_object;
