//! The built-in environments, each a port of gymnasium 1.4.0's, step for step.

pub mod acrobot;
pub mod cartpole;
pub mod frozen_lake;
pub mod mountain_car;
pub mod taxi;

pub use acrobot::Acrobot;
pub use cartpole::CartPole;
pub use frozen_lake::FrozenLake;
pub use mountain_car::MountainCar;
pub use taxi::Taxi;
