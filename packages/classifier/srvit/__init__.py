"""srvit: recursive ViT classifiers (bViT, SR-ViT)."""
