"""The launcher side of accelify, which runs before any rank: `accelify launch` (the launcher and
what it reports when a rank fails), the config file and its questions (and HF Accelerate's
config, translated), the script check for HF's own Accelerator, and `accelify env`. Nothing here
imports torch at import time; the code that runs inside each rank is the rest of
`accelify.runtime`.
"""
