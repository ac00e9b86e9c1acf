"""Many machines behind one server: `kope worker` devices on a Ray cluster (the optional `cluster` extra). Only
this package imports ray, and only when a cluster is configured."""
