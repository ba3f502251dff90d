"""Training-time data: the chunk dataset, view samplers and the LightningDataModule."""
