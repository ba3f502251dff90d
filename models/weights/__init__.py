"""Weights: locations (hub, local folders, official files), reading and writing, pretrained configs
(``architecture.tag``)."""
