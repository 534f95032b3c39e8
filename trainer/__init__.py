"""Training: the FlashREINFORCE objective, the learner, the async loop, pools and checkpoints."""
