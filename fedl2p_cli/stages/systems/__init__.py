"""The personalised-FL systems `fedl2p pfl-train` trains, one module each (named by the registered `System.trainer`).
Each module is an `api.SystemTrainer` (fedl2p_cli/api.py), as a plugin's system is: SETTINGS (the PFLConfig fields
its artifact id includes besides the shared ones), train(cfg, part, ckpt, progress, draft, runtime) -> (history,
metrics) writing its weights into the draft, load(art, cfg, model) -> its trained state, and accuracy(trained, client,
data, seed, steps)."""
