"""Speech Commands: the loader on a small folder in the official layout (written here), the paper's speaker pools
and splits, bad input, and the embedded espeak-ng set through the whole pipeline."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from scipy.io import wavfile

from fedl2p_cli.data import speech
from fedl2p_cli.io import partition_h5
from tests.test_cli import cli, tree

from .helpers import handed

RATE = speech.SAMPLE_RATE
# speaker -> (clips per word, which list): the training speakers have 5, 3, 2 and 1 clips per word
SPEAKERS = {"aaaa0001": (5, None), "aaaa0002": (3, None), "aaaa0003": (2, None), "aaaa0004": (1, None),
            "bbbb0001": (4, "validation_list.txt"), "bbbb0002": (2, "testing_list.txt"), "bbbb0003": (1, "testing_list.txt")}
WORDS = ["yes", "no", "stop", "bed"]  # "bed" is not a command: class "unknown"


def tone(freq: float, n: int = RATE, amp: float = 0.3) -> np.ndarray:
    return (amp * 32767 * np.sin(2 * np.pi * freq * np.arange(n) / RATE)).astype(np.int16)


def write_folder(root, speakers=SPEAKERS, rate=RATE):
    lists = {"validation_list.txt": [], "testing_list.txt": []}
    for w, word in enumerate(WORDS):
        (root / word).mkdir(parents=True)
        for s, (n, listed) in speakers.items():
            for k in range(n):
                wavfile.write(root / word / f"{s}_nohash_{k}.wav", rate, tone(300 + 400 * w + 10 * k, rate))
                if listed:
                    lists[listed].append(f"{word}/{s}_nohash_{k}.wav")
    for name, rows in lists.items():
        (root / name).write_text("\n".join(rows) + "\n")
    (root / speech.NOISE_DIR).mkdir()
    wavfile.write(root / speech.NOISE_DIR / "white_noise.wav", RATE,
                  (0.1 * 32767 * np.random.default_rng(0).standard_normal(3 * RATE)).astype(np.int16))
    return root


def test_loader_picks_the_speakers_with_most_data_and_labels_twelve_classes(tmp_path):
    ds = speech.load_speech_commands(write_folder(tmp_path / "sc"), seen=3, unseen=2, size=16)
    assert ds.group_names == ["aaaa0001", "aaaa0002", "aaaa0003", "bbbb0001", "bbbb0002"]  # most clips first, per pool
    assert ds.domain_names == speech.POOLS
    assert ds.images.shape[1:] == (1, 16, 16) and ds.images.dtype.__str__() == "torch.uint8"
    groups, labels, pools = ds.groups.numpy(), ds.labels.numpy(), ds.domains.numpy()
    for g, name in enumerate(ds.group_names):
        n = SPEAKERS[name][0]
        mine = labels[groups == g]
        n_sil = int(round(0.1 * 4 * n))
        assert len(mine) == 4 * n + n_sil  # its clips, plus 10% silence cut from the background noise
        assert np.bincount(mine, minlength=12).tolist() == (
            [n, n] + [0] * 6 + [n, 0] + [n, n_sil])  # yes, no, ..., stop, go, unknown (bed), silence
        assert set(pools[groups == g]) == {0 if name.startswith("a") else 1}


def test_partition_one_client_per_speaker_with_the_papers_splits(tmp_path, capsys, monkeypatch):
    root = write_folder(tmp_path / "sc")
    code, out, err = cli(capsys, monkeypatch, tmp_path / "store", "partition", "--dataset", "speechcommands",
                         "--data-dir", root, "--clients", 5, "--unseen-fraction", 0.4, "--spectrogram", 16, "--no-plot")
    assert code == 0, err
    (h5,) = (tmp_path / "store").rglob("partition.h5")
    p = partition_h5.read(h5)
    assert p.num_clients == 5 and p.unseen.tolist() == [False, False, False, True, True]
    assert json.loads(p.attrs["speakers"]) == ["aaaa0001", "aaaa0002", "aaaa0003", "bbbb0001", "bbbb0002"]
    for c in range(5):
        n = int(p.offsets[c, 3] - p.offsets[c, 0])
        n_test = round(0.2 * n)
        n_val = round(0.2 * (n - n_test))  # 80/20 train/test, then 20% of train held out for validation
        assert (p.offsets[c, 1] - p.offsets[c, 0], p.offsets[c, 2] - p.offsets[c, 1], p.offsets[c, 3] - p.offsets[c, 2]) \
            == (n - n_test - n_val, n_val, n_test)
    with h5py.File(h5) as f:
        assert f["images"].shape[1:] == (1, 16, 16)


def bad_cases(tmp_path):
    ok = write_folder(tmp_path / "ok")
    low = tmp_path / "rate"
    write_folder(low)
    wavfile.write(low / "yes" / "aaaa0002_nohash_0.wav", 8000, tone(440, 8000))
    empty = tmp_path / "empty"
    write_folder(empty)
    wavfile.write(empty / "no" / "aaaa0003_nohash_1.wav", RATE, np.zeros(0, dtype=np.int16))
    nolist = tmp_path / "nolist"
    write_folder(nolist)
    (nolist / "testing_list.txt").unlink()
    nonoise = tmp_path / "nonoise"
    write_folder(nonoise)
    shutil.rmtree(nonoise / speech.NOISE_DIR)
    base = ["partition", "--dataset", "speechcommands", "--clients", 5, "--unseen-fraction", 0.4, "--data-dir"]
    return [
        (base + [tmp_path / "missing"], "needs --data-dir with the official Speech Commands folder"),
        (base + [low], "aaaa0002_nohash_0.wav is sampled at 8000 Hz"),
        (base + [empty], "aaaa0003_nohash_1.wav holds no samples"),
        (base + [nolist], "has no testing_list.txt"),
        (base + [nonoise], "_background_noise_ holds no wav files"),
        (["partition", "--dataset", "speechcommands", "--clients", 9, "--unseen-fraction", 0.4, "--data-dir", ok],
         "5 training speakers were asked for but the folder has 4"),
        (base + [ok, "--scheme", "shards"], "--scheme does not apply to speechcommands"),
        (base + [ok, "--spectrogram", 4], "--spectrogram"),
    ]


def test_bad_speech_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    for args, expect in bad_cases(tmp_path):
        code, out, err = cli(capsys, monkeypatch, store, *args)
        assert code == 2, (args, err)
        assert len(err.strip().splitlines()) == 1 and expect in err and "Traceback" not in err, (args, err)
        assert tree(store) in (None, []), args


def test_a_speaker_too_small_to_split_is_refused(tmp_path, capsys, monkeypatch):
    root = write_folder(tmp_path / "sc", {"aaaa0001": (1, None), "aaaa0002": (0, None), "bbbb0001": (1, "testing_list.txt")})
    for word in WORDS[1:]:  # aaaa0002 said only "yes" once: one clip and no silence
        (root / word / "aaaa0002_nohash_0.wav").unlink(missing_ok=True)
    wavfile.write(root / "yes" / "aaaa0002_nohash_0.wav", RATE, tone(300))
    code, _, err = cli(capsys, monkeypatch, tmp_path / "store", "partition", "--dataset", "speechcommands", "--data-dir",
                       root, "--clients", 3, "--unseen-fraction", 0.34)
    assert code == 2 and "speaker aaaa0002 has 1 clips; a client needs at least 3" in err, err


needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")


@needs_espeak
def test_synthetic_set_is_written_in_the_official_layout(tmp_path):
    from fedl2p_cli.data import synth_speech
    root = synth_speech.generate(tmp_path / "synth", train_speakers=3, heldout_speakers=2, seed=0)
    assert sorted(p.name for p in (root / speech.NOISE_DIR).glob("*.wav")) == \
        ["brown_noise.wav", "mains_hum.wav", "pink_noise.wav", "white_noise.wav"]
    by_speaker, heldout = speech.scan(root)
    assert len(by_speaker) == 5 and len(heldout) == 2
    listed = (root / "validation_list.txt").read_text().split() + (root / "testing_list.txt").read_text().split()
    assert {p.split("/")[1].split("_")[0] for p in listed} == heldout
    for clips in by_speaker.values():
        assert {c.word for c in clips} >= set(speech.WORDS)
        rate, x = wavfile.read(clips[0].path)
        assert rate == RATE and x.shape == (RATE,) and np.abs(x).max() > 1000


@needs_espeak
def test_the_whole_speech_path_runs_on_the_embedded_set(tmp_path):
    """partition -> pretrain (seen speakers) -> stats -> meta-train (seen) -> personalize seen and unseen speakers.
    (`analyze clusters` compares clusterings with feature-shift domains; a speaker partition has none, one client
    each, and is refused there in one line.)"""
    from fedl2p_cli.stages import pipeline
    from fedl2p_cli.stages.common import NoProgress
    f = tmp_path / "speech.toml"
    f.write_text(SPEECH_TOML)
    done = pipeline.run(pipeline.load(f, tmp_path / "store"), None, NoProgress, runtime=handed())
    assert [r.stage for r in done] == ["partition", "pretrain", "stats", "meta-train", "personalize", "personalize"]
    part = partition_h5.read(done[0].artifact.file("partition.h5"))
    assert part.dataset == "speech-synth" and part.unseen.sum() == 2 and part.num_clients == 6
    assert part.classes == speech.CLASSES
    for r in done:
        if r.stage == "personalize":
            assert set(r.artifact.metrics) >= {"ft-bnc", "ft-bng", "ft-bni"} and any(k.startswith("fedl2p")
                                                                                    for k in r.artifact.metrics)


SPEECH_TOML = """
name = "speech-tiny"
[partition]
dataset = "speech-synth"
clients = 6
unseen_fraction = 0.34
spectrogram = 16
[pretrain]
rounds = 2
fraction = 0.5
batch_size = 16
[stats]
[[meta-train]]
rounds = 1
fraction = 0.5
epochs = 1
batch_size = 16
base_lr = 0.01
[personalize]
pools = ["seen", "unseen"]
epochs = 1
batch_size = 16
base_lr = 0.01
seeds = [0]
"""
