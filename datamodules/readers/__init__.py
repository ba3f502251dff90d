"""Readers and writers of scenes: the chunk format, COLMAP models, image folders and videos. No
Lightning."""
