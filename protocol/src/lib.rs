pub mod native;
pub mod placement;
pub mod routing;
