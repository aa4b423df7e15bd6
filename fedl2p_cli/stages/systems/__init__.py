"""The personalised-FL systems `fedl2p pfl-train` trains, one module each (named by the method registry's `System.
trainer`). A module provides: SETTINGS (the PFLConfig fields its artifact id includes besides the shared ones),
train(cfg, part, ckpt, progress, draft) -> (history, metrics) writing its weights into the draft,
load(art, cfg, model) -> its trained state, and accuracy(trained, client, data, seed, steps)."""
