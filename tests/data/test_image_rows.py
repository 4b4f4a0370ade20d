"""A data file's ``images`` column: paths relative to the file, data URIs, bare base64 and image records load as
images; a missing or corrupt image is an error naming the file, the line and the image."""

import base64
import io
import json
import random

import pytest
from PIL import Image

from reasonrl.data.loaders import DataError, load_examples


def png_bytes(colour):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 6), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_every_way_to_give_an_image_loads_it(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "red.png").write_bytes(png_bytes("red"))
    encoded = base64.b64encode(png_bytes("blue")).decode()
    rows = [
        {"question": "colour?", "answer": "red", "images": "pics/red.png"},  # relative to the file
        {"question": "colour?", "answer": "blue", "images": [f"data:image/png;base64,{encoded}"]},
        {"question": "colours?", "answer": "2", "images": [encoded, str(tmp_path / "pics" / "red.png")]},
        {"question": "no image", "answer": "1"},
    ]
    examples = load_examples(str(write(tmp_path / "data.jsonl", rows)))
    assert [len(e.images) for e in examples] == [1, 1, 2, 0]
    assert examples[0].images[0].getpixel((0, 0)) == (255, 0, 0)
    assert examples[1].images[0].getpixel((0, 0)) == (0, 0, 255)
    assert examples[2].images[0].size == (8, 6) and examples[2].images[1].getpixel((3, 3)) == (255, 0, 0)
    assert "images" not in examples[0].fields  # not passed to reward functions as JSON


def test_a_large_image_in_bare_base64_loads(tmp_path):
    noise = Image.frombytes("RGB", (64, 64), random.Random(0).randbytes(64 * 64 * 3))
    buffer = io.BytesIO()
    noise.save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode()
    assert len(encoded) > 4096  # longer than a file name may be
    data = write(tmp_path / "data.jsonl", [{"question": "q", "answer": "a", "images": encoded}])
    (example,) = load_examples(str(data))
    assert example.images[0].tobytes() == noise.tobytes()


def test_parquet_image_records_load(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    table = pa.table({"question": ["colour?"], "answer": ["red"], "images": [[{"bytes": png_bytes("red")}]]})
    pq.write_table(table, tmp_path / "data.parquet")
    (example,) = load_examples(str(tmp_path / "data.parquet"))
    assert example.images[0].getpixel((1, 1)) == (255, 0, 0)


@pytest.mark.parametrize(
    ("images", "message"),
    [
        ("pics/missing.png", r"data.jsonl:2: image 1 of 1: no image file .*pics/missing.png"),
        (["data:image/png;base64,@@@"], r"data.jsonl:2: image 1 of 1: the base64 data does not decode"),
        ("corrupt.png", r"data.jsonl:2: image 1 of 1 \(.*corrupt.png\) is not a readable image"),
        ([12], r"data.jsonl:2: image 1 of 1 is a int; give a path"),
        ([""], r"data.jsonl:2: image 1 of 1 is an empty string"),
        ("large.png", r"data.jsonl:2: image 1 of 1 \(.*large.png\) is 5000 x 5000 pixels, over the"),
        ("bomb.png", r"data.jsonl:2: image 1 of 1 \(.*bomb.png\) is not a readable image: .*decompression bomb"),
    ],
)
def test_a_missing_or_corrupt_image_names_the_file_line_and_image(tmp_path, images, message):
    (tmp_path / "corrupt.png").write_bytes(png_bytes("red")[:20])
    Image.new("1", (5000, 5000)).save(tmp_path / "large.png")  # over reasonrl's limit
    Image.new("1", (15000, 15000)).save(tmp_path / "bomb.png")  # 28 kB that would decode to 675 MB of RGB
    rows = [{"question": "fine", "answer": "1"}, {"question": "colour?", "answer": "red", "images": images}]
    with pytest.raises(DataError, match=message):
        load_examples(str(write(tmp_path / "data.jsonl", rows)))
