"""The paper's published figures (LSM-GNN, section 5), as its text states them.

Only numbers the text gives are here: the figures' other bars are not in the text, and reading them off a plot
would be a guess. Sizes are the paper's per-GPU cache of 4, 8 and 16 GB over IGB-Full (269M nodes of 1024
float32 features, 1.1 TB): 0.37%, 0.74% and 1.5% of the nodes, which the runs here scale to their graphs.
"""

#: the paper's cache sizes (GB per GPU) and the share of IGB-Full's feature rows each holds
PAPER_CACHE_GB = (4, 8, 16)
IGB_FULL_NODES = 269_346_174
IGB_FULL_ROW_BYTES = 1024 * 4
SIZE_SHARES = tuple(gb * 2**30 / (IGB_FULL_NODES * IGB_FULL_ROW_BYTES) for gb in PAPER_CACHE_GB)

#: Fig. 10: hit ratio per eviction policy (window 256 for D and H) at 4 / 8 / 16 GB; None where the text gives
#: no number (section 5.3: "The static eviction policy achieves cache hit ratios of 0.19, 0.27, and 0.37, while the
#: hybrid eviction policy attains 0.25, 0.33, and 0.48"; "increasing it from 0.23 to 0.48 when the cache size is
#: 16 GB" for Round-Robin)
FIG10_HIT_RATIO = {
    "rr": (None, None, 0.23),
    "static": (0.19, 0.27, 0.37),
    "hybrid": (0.25, 0.33, 0.48),
}

#: Fig. 11: the hybrid policy's hit ratio with PVP at 4 / 8 / 16 GB (section 5.4: "PVP elevates the hit ratio from
#: 0.25, 0.33, and 0.48 to 0.52, 0.60, and 0.69"), and the feature aggregation speedups it gives with 2 and 4 SSDs
FIG11_HIT_RATIO = {"hybrid": (0.25, 0.33, 0.48), "hybrid+pvp": (0.52, 0.60, 0.69)}
FIG11_SPEEDUP = {"2 SSDs": (1.54, 1.53, 1.68), "4 SSDs": (1.38, 1.46, 1.51)}

#: Fig. 9: the communication layer's feature aggregation speedup over isolated caches at 16 GB with the hybrid
#: policy (section 5.2), and the exchange's share of the aggregation time at worst
FIG9_SPEEDUP_16GB_HYBRID = 1.18
FIG9_EXCHANGE_SHARE_AT_MOST = 0.05

#: Fig. 12: epoch time speedups at best (section 5.5)
FIG12_SPEEDUP_OVER_MGIDS = 1.54
FIG12_SPEEDUP_OVER_DISTDGL = 3.75

#: our policy names for the paper's (Fig. 10's RR, S, D1/D2, H1/H2: D1 and H1 with a window of 64)
PAPER_POLICIES = {"RR": "rr", "S": "static", "D1": "dynamic@window=64", "D2": "dynamic",
                  "H1": "hybrid@window=64", "H2": "hybrid"}

#: Fig. 12's hardware, for the link / SSD bandwidth ratio the figure marks. The paper names its SSDs (Table 1:
#: "Intel Optane SSDs, PCIe Gen 4", one per GPU, 2 in all) and DistDGL's nodes (DGX-A100), not the network
#: between them nor the SSDs' bandwidth; these two are assumptions from the vendors' data sheets, not the text:
#: the Optane P5800X reads 4 KiB at random at 1.5M IOPS (about 6.1 GB/s), and a DGX-A100's compute network is
#: 200 Gbit/s HDR InfiniBand per adapter (one adapter assumed between the two nodes' GPUs in use)
PAPER_SSDS = 2
PAPER_SSD_GB_S = 6.1
PAPER_LINK_GBIT_S = 200
