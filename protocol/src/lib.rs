pub mod cluster_map;
pub mod native;
pub mod placement;
pub mod routing;
