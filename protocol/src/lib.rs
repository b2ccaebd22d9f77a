pub mod native;
pub mod routing;
