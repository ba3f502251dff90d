"""``view.py``'s viewer: the browser viewer (viser) of Gaussians and their cameras with the
family's inference knobs live (``server``), and the scene reconstructed live from photos
(``live``). The commands' layer: nothing in ``models/`` below it imports it."""
