"""Personalised-FL systems as round strategies: `base.PFLSystem`, the class every system is (`api.PFLSystem`),
`options` (a system's own options), and fedl2p's own systems, each a `PFLSystem` as a plugin's system is:
pfedla.PFedLA (pFedLA and HeurpFedLA, Ma et al., CVPR 2022) and cafeme.CAFeMe (Vettoruzzo et al., SDM 2024)."""
