import math

import torch

from models.geometry import cameras


def pose(rotation: torch.Tensor, translation) -> torch.Tensor:
    m = torch.eye(4)
    m[:3, :3] = rotation
    m[:3, 3] = torch.tensor(translation, dtype=torch.float32)
    return m


def rot_y(angle: float) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=torch.float32)


K_NORM = torch.tensor([[0.5, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])


def test_intrinsics_pixel_round_trip():
    px = cameras.intrinsics_to_pixels(K_NORM, (48, 64))
    # fx = 0.5 * 64 = 32, fy = 1.0 * 48 = 48, cx = 32, cy = 24
    assert torch.equal(px, torch.tensor([[32.0, 0, 32], [0, 48.0, 24], [0, 0, 1]]))
    assert torch.equal(cameras.intrinsics_to_normalized(px, (48, 64)), K_NORM)


def test_pixel_grid_centres():
    grid = cameras.pixel_grid((2, 4))
    assert grid.shape == (2, 4, 2)
    assert torch.allclose(grid[0, 0], torch.tensor([0.125, 0.25]))
    assert torch.allclose(grid[1, 3], torch.tensor([0.875, 0.75]))


def test_unproject_hand_computed():
    # Pixel at normalised (0.75, 0.5) with fx=0.5, cx=0.5: x/z = (0.75-0.5)/0.5 = 0.5.
    coords = torch.tensor([[0.75, 0.5]])
    point = cameras.unproject(coords, torch.tensor([2.0]), K_NORM, torch.eye(4))
    assert torch.allclose(point, torch.tensor([[1.0, 0.0, 2.0]]))
    # Camera translated by (0, 0, -1) and rotated 90 degrees about y: its +z is world +x.
    c2w = pose(rot_y(math.pi / 2), [0.0, 0.0, -1.0])
    point = cameras.unproject(coords, torch.tensor([2.0]), K_NORM, c2w)
    # camera-frame (1, 0, 2) -> world R @ p + t = (2, 0, -1) + (0, 0, -1)
    assert torch.allclose(point, torch.tensor([[2.0, 0.0, -2.0]]), atol=1e-6)


def test_project_inverts_unproject():
    c2w = pose(rot_y(0.3), [0.2, -0.1, 0.5])
    coords = torch.rand(10, 2)
    depth = torch.rand(10) + 0.5
    points = cameras.unproject(coords, depth, K_NORM, c2w)
    uv, z = cameras.project(points, c2w, K_NORM)
    assert torch.allclose(uv, coords, atol=1e-5)
    assert torch.allclose(z, depth, atol=1e-5)


def test_rays_have_unit_z_in_camera_frame():
    c2w = pose(rot_y(0.7), [1.0, 2.0, 3.0])
    origins, dirs = cameras.get_rays(c2w, K_NORM, (3, 5))
    assert origins.shape == dirs.shape == (15, 3)
    assert torch.allclose(origins, torch.tensor([1.0, 2.0, 3.0]).expand(15, 3))
    dirs_cam = dirs @ c2w[:3, :3]  # R^T d
    assert torch.allclose(dirs_cam[:, 2], torch.ones(15), atol=1e-6)


def test_plucker_embedding():
    c2w = pose(torch.eye(3), [1.0, 0.0, 0.0])
    emb = cameras.plucker_embedding(c2w, K_NORM, (4, 4))
    assert emb.shape == (6, 4, 4)
    d = emb[:3].permute(1, 2, 0)
    m = emb[3:].permute(1, 2, 0)
    assert torch.allclose(d.norm(dim=-1), torch.ones(4, 4), atol=1e-6)
    # moment = o x d with o = (1, 0, 0): (0, -dz, dy)
    assert torch.allclose(m[..., 0], torch.zeros(4, 4))
    assert torch.allclose(m[..., 1], -d[..., 2], atol=1e-6)
    assert torch.allclose(m[..., 2], d[..., 1], atol=1e-6)


def test_invert_and_world_to_camera():
    c2w = pose(rot_y(0.4), [0.5, -1.0, 2.0])
    w2c = cameras.world_to_camera(c2w)
    assert torch.allclose(w2c @ c2w, torch.eye(4), atol=1e-6)
    assert torch.allclose(cameras.camera_to_world(w2c), c2w, atol=1e-6)


def test_normalize_scene_identity_and_unit_baseline():
    ctx = torch.stack(
        [
            pose(rot_y(0.2), [1.0, 0.0, 0.0]),
            pose(rot_y(-0.1), [1.0, 0.0, 4.0]),
            pose(rot_y(0.0), [4.0, 0.0, 0.0]),
        ]
    )[None]  # [1, 3, 4, 4]
    target = pose(rot_y(0.5), [2.0, 1.0, 1.0])[None, None]
    ctx_n, (target_n,), scale = cameras.normalize_scene(ctx, target)
    assert torch.allclose(ctx_n[0, 0], torch.eye(4), atol=1e-6)
    assert torch.allclose(scale, torch.tensor([5.0]))  # distance between views 1 and 2
    centers = ctx_n[0, :, :3, 3]
    assert torch.allclose(torch.cdist(centers, centers).max(), torch.tensor(1.0))
    # Relative poses are preserved up to the scale: target relative to context 0.
    rel = torch.linalg.inv(ctx[0, 0]) @ target[0, 0]
    rel[:3, 3] /= 5.0
    assert torch.allclose(target_n[0, 0], rel, atol=1e-6)


def test_normalize_single_view_scale_one():
    ctx = pose(rot_y(0.3), [3.0, 2.0, 1.0])[None, None]
    ctx_n, _, scale = cameras.normalize_scene(ctx)
    assert torch.allclose(ctx_n[0, 0], torch.eye(4), atol=1e-6)
    assert scale.item() == 1.0


def test_focal_to_fov():
    fov = cameras.focal_to_fov(K_NORM)
    assert torch.allclose(fov, torch.tensor([math.pi / 2, 2 * math.atan(0.5)]))
