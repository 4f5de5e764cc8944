"""The advisor's model: which sampling mode, with which settings, is fastest on a simulator.

    lengths.py  EpisodeLengths: the episode-length distribution from a sample, cut episodes
                included (Kaplan-Meier)
    events.py   the discrete-event kernel: simulated time, processes, FIFO locks, step turns
    model.py    the simulator's measured costs (SimulatorCosts), the broker's own rules for each
                mode in simulated time, and `predict` / `rank` / `best_alpha`
    probe.py    those costs and the episode lengths measured through a SlotPool (`probe_server`,
                `probe_lengths`)
    auto_alpha.py  `--alpha auto`: the run's own costs and censored lengths over a window, the
                model's curve over the alphas inside the user's bounds (averaged over seeds and
                decisions), and the alpha in force kept unless another beats it by a margin
    auto_mode.py   `--mode auto`: the run's measured throughput per mode, probes of the other
                candidates, and the switch past a margin

Maths only: no sockets, no asyncio, no wall clock. It lives in the broker because it models the
broker's rules with the broker's own rule objects (broker/samplers/) and dealer, and because the
broker is where a run chooses alpha (auto_alpha.py) and its mode (auto_mode.py); docs/advisor.md.

Nothing is imported here: broker/config.py reads auto_mode.py's defaults, and every process that
parses a broker setting would otherwise load the model too. Import from the modules.
"""
