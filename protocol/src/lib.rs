pub mod routing;
