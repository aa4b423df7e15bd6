"""fedl2p's own personalised-FL systems, each an `algorithms.system.PFLSystem` as a plugin's system is:
pfedla.PFedLA (pFedLA and HeurpFedLA, Ma et al., CVPR 2022) and cafeme.CAFeMe (Vettoruzzo et al., SDM 2024)."""
