"""gymnasium 1.4.0's environment steps per second, the peer of
`cargo run --release -p trident-rl --example env_steps`: one copy made by `gym.make`
(its wrappers included, as users run it), uniformly random actions, resets included.

    python3 benches/peers/gymnasium_steps.py [STEPS]      # pip install gymnasium==1.4.0
"""
import random
import sys
import time

import gymnasium as gym

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
for env_id in ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "FrozenLake-v1", "Taxi-v4"]:
    env = gym.make(env_id)
    n = env.action_space.n
    rng = random.Random(1)
    env.reset(seed=0)
    episodes = 0
    t = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.randrange(n))
        if terminated or truncated:
            env.reset()
            episodes += 1
    secs = time.perf_counter() - t
    print(f"{env_id:<16} {steps / secs:>12.0f} steps/s  ({steps} steps, {episodes} episodes, {secs:.3f} s)")

# gymnasium's own vectorised CartPole (numpy over the copies), 8 and 64 copies.
import numpy as np

for n in (8, 64):
    envs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    envs.reset(seed=0)
    rng = np.random.default_rng(1)
    iters = max(steps // n, 1)
    t = time.perf_counter()
    for _ in range(iters):
        envs.step(rng.integers(0, 2, size=n))
    secs = time.perf_counter() - t
    print(f"CartPole-v1 x{n:<3} (vector entry point) {iters * n / secs:>10.0f} steps/s")
