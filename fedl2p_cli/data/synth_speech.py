"""An embedded spoken-commands set: the 12-class Speech Commands task spoken by synthetic speakers (espeak-ng).

It is NOT the real dataset. It exists so that the whole speech path (partition -> pretrain -> stats -> meta-train ->
personalize seen and unseen speakers -> analyze) runs offline and in tests. `generate` writes a folder in the
official layout (`<word>/<speaker>_nohash_<n>.wav`, the split lists, `_background_noise_/`), which the real
loader (`speech.load_speech_commands`) then reads, so both share one path.

A synthetic speaker is an accent and voice variant of espeak-ng with its own pitch, speed and loudness, a
microphone (band-pass filter) and a room (background noise at its own signal-to-noise ratio), and it says each
command word a number of times of its own (so clients differ in size, as the real speakers do). Utterances jitter
pitch, speed and their position in the one-second window.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from .speech import NOISE_DIR, SAMPLE_RATE, WORDS, fit_second

UNKNOWN_WORDS = ["bed", "bird", "cat", "dog", "happy", "house", "marvin", "sheila", "tree", "wow", "zero", "one",
                 "two", "three", "four", "five", "six", "seven", "eight", "nine"]
ACCENTS = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029"]
VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5", "croak", "klatt", "klatt2",
            "klatt3", "Andy", "Annie", "Belinda", "Boris", "David", "Gene", "Jacky", "Lee", "Linda", "Max", "Michael",
            "Paul", "Rob", "Steph", "Tweaky", "Zac", "grandma", "grandpa", "whisper"]
NOISE_SECONDS = 20


@dataclass(frozen=True)
class Speaker:
    name: str
    voice: str
    pitch: int        # espeak-ng -p (0..99)
    speed: int        # espeak-ng -s (words per minute)
    gain: float       # linear, applied after synthesis
    band: tuple[float, float]  # microphone pass band (Hz)
    noise: int        # which background recording is the speaker's room
    snr_db: float
    repeats: int      # times each command word is said
    unknown: tuple[str, ...]


def draw_speakers(n: int, rng: np.random.Generator) -> list[Speaker]:
    names: set[str] = set()
    out: list[Speaker] = []
    while len(out) < n:
        name = f"{rng.integers(16 ** 8):08x}"
        if name in names:
            continue
        names.add(name)
        out.append(Speaker(
            name=name, voice=f"{ACCENTS[rng.integers(len(ACCENTS))]}+{VARIANTS[rng.integers(len(VARIANTS))]}",
            pitch=int(rng.integers(10, 91)), speed=int(rng.integers(110, 231)), gain=float(10 ** rng.uniform(-1.2, 0)),
            band=(float(rng.uniform(80, 500)), float(rng.uniform(2500, 7800))), noise=int(rng.integers(4)),
            snr_db=float(rng.uniform(0, 30)), repeats=int(rng.integers(1, 7)),
            unknown=tuple(rng.choice(UNKNOWN_WORDS, size=int(rng.integers(3, 13)), replace=False))))
    return out


def background_noises(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Four one-channel recordings for `_background_noise_`: white, pink, brown noise and mains hum."""
    n = NOISE_SECONDS * SAMPLE_RATE
    white = rng.standard_normal(n)
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.maximum(np.fft.rfftfreq(n, 1 / SAMPLE_RATE), 1.0)
    pink, brown = np.fft.irfft(spectrum / np.sqrt(f), n), np.fft.irfft(spectrum / f, n)
    t = np.arange(n) / SAMPLE_RATE
    hum = sum(np.sin(2 * np.pi * 50 * k * t + rng.uniform(0, 2 * np.pi)) / k for k in (1, 2, 3, 5)) + 0.05 * white
    out = {"white_noise": white, "pink_noise": pink, "brown_noise": brown, "mains_hum": hum}
    return {k: (0.3 * v / np.abs(v).max()).astype(np.float32) for k, v in out.items()}


def speak(word: str, voice: str, pitch: int, speed: int) -> np.ndarray:
    """espeak-ng's rendering of `word` at 16 kHz, leading and trailing silence trimmed."""
    from scipy.io import wavfile
    from scipy.signal import resample_poly
    with tempfile.NamedTemporaryFile(suffix=".wav") as tmp:
        run = subprocess.run(["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(speed), "-w", tmp.name, word],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise DataError(f"espeak-ng failed on '{word}' with voice {voice}: {run.stderr.strip()[:200]}")
        rate, x = wavfile.read(tmp.name)
    x = resample_poly(x.astype(np.float32) / 32768.0, SAMPLE_RATE // 50, rate // 50)
    loud = np.nonzero(np.abs(x) > 0.02 * np.abs(x).max())[0]
    return x[loud[0]:loud[-1] + 1] if loud.size else x


def render(clean: np.ndarray, s: Speaker, noise: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Place an utterance in the second, through the speaker's microphone, in its room, at its loudness."""
    from scipy.signal import butter, sosfilt
    clean = fit_second(clean) if clean.size > SAMPLE_RATE else clean
    start = rng.integers(0, SAMPLE_RATE - clean.size + 1)
    x = np.zeros(SAMPLE_RATE, dtype=np.float32)
    x[start:start + clean.size] = clean / max(np.abs(clean).max(), 1e-6)
    x = sosfilt(butter(2, s.band, btype="bandpass", fs=SAMPLE_RATE, output="sos"), x)
    cut = rng.integers(0, noise.size - SAMPLE_RATE)
    room = noise[cut:cut + SAMPLE_RATE]
    room = room * np.sqrt(np.mean(x ** 2) / max(np.mean(room ** 2), 1e-12)) * 10 ** (-s.snr_db / 20)
    return np.clip(s.gain * 0.8 * (x + room) / max(np.abs(x + room).max(), 1e-6), -1, 1).astype(np.float32)


def _utterances(s: Speaker) -> list[str]:
    return [w for w in WORDS for _ in range(s.repeats)] + list(s.unknown)


def generate(root: Path, train_speakers: int, heldout_speakers: int, seed: int = 0) -> Path:
    """Write the synthetic set in the official Speech Commands layout under `root`; returns `root`."""
    if shutil.which("espeak-ng") is None:
        raise DataError("the embedded spoken-commands set is synthesised by espeak-ng, which is not installed "
                        "(`apt-get install espeak-ng`, or `make setup`)")
    from scipy.io import wavfile
    rng = np.random.default_rng(seed)
    speakers = draw_speakers(train_speakers + heldout_speakers, rng)
    noises = background_noises(rng)
    (root / NOISE_DIR).mkdir(parents=True, exist_ok=True)
    for k, v in noises.items():
        wavfile.write(root / NOISE_DIR / f"{k}.wav", SAMPLE_RATE, (v * 32767).astype(np.int16))
    jobs = [(s, w, int(np.clip(s.pitch + rng.integers(-8, 9), 0, 99)), int(s.speed * rng.uniform(0.9, 1.1)))
            for s in speakers for w in _utterances(s)]
    with ThreadPoolExecutor(4) as pool:  # espeak-ng runs in its own processes
        clean = list(pool.map(lambda j: speak(j[1], j[0].voice, j[2], j[3]), jobs))
    lists: dict[str, list[str]] = {"validation_list.txt": [], "testing_list.txt": []}
    held = {s.name: i for i, s in enumerate(speakers[train_speakers:])}
    counts: dict[tuple[str, str], int] = {}
    rooms = list(noises.values())
    for (s, word, _, _), x in zip(jobs, clean):
        n = counts[(s.name, word)] = counts.get((s.name, word), -1) + 1
        rel = f"{word}/{s.name}_nohash_{n}.wav"
        (root / word).mkdir(exist_ok=True)
        wav = render(x, s, rooms[s.noise], rng)
        wavfile.write(root / rel, SAMPLE_RATE, (wav * 32767).astype(np.int16))
        if s.name in held:
            lists["validation_list.txt" if held[s.name] % 2 == 0 else "testing_list.txt"].append(rel)
    for name, rows in lists.items():
        (root / name).write_text("".join(r + "\n" for r in rows))
    return root
