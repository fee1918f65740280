"""reslm.core.native: a package C source compiled here once, cached by what it was built from, and None
(with the reason) where it cannot be built, so callers fall back to their torch path."""
import ctypes

import pytest

from reslm.core import native

SOURCE = "int reslm_twice(int x) { return 2 * x * SCALE; }\n"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESLM_CACHE", str(tmp_path / "cache"))
    native.build.cache_clear()
    yield tmp_path / "cache" / "kernels"
    native.build.cache_clear()


def test_a_source_is_compiled_once_per_macro_set_and_loaded(tmp_path, cache):
    if native.compiler() is None:
        pytest.skip("no C compiler here")
    src = tmp_path / "twice.c"
    src.write_text(SOURCE)
    lib = native.build(src, (("SCALE", 3),))
    lib.reslm_twice.argtypes, lib.reslm_twice.restype = [ctypes.c_int], ctypes.c_int
    assert lib.reslm_twice(5) == 30
    built = sorted(cache.glob("twice-*.so"))
    native.build.cache_clear()
    native.build(src, (("SCALE", 3),))                       # the cached library, not a new build
    assert sorted(cache.glob("twice-*.so")) == built and len(built) == 1
    native.build(src, (("SCALE", 4),))                       # other macros: another library
    src.write_text(SOURCE + "/* changed */\n")
    native.build.cache_clear()                               # (a process loads a source's library once)
    native.build(src, (("SCALE", 3),))                       # a changed source: another library
    assert len(list(cache.glob("twice-*.so"))) == 3 and not list(cache.glob(".*"))


def test_no_compiler_or_a_compiler_error_gives_none_and_says_why(tmp_path, cache, monkeypatch):
    src = tmp_path / "broken.c"
    src.write_text("int reslm_broken( {\n")
    if native.compiler() is not None:
        assert native.build(src, ()) is None
        assert "failed on broken.c" in native.why_not(src)
        assert not list(cache.glob("broken-*"))              # nothing half-made left behind
    native.build.cache_clear()
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    assert native.compiler() is None
    assert native.build(src, ()) is None and native.why_not(src).startswith("no C compiler")


def test_the_target_is_native_unless_reslm_march_names_another(monkeypatch):
    from reslm.core.errors import ReslmError
    monkeypatch.delenv("RESLM_MARCH", raising=False)
    assert native.march() == "native"
    monkeypatch.setenv("RESLM_MARCH", "haswell")
    assert native.march() == "haswell"
    if native.compiler() is not None:
        assert native.vector_floats() == 8                     # haswell: AVX2, no AVX-512
    monkeypatch.setenv("RESLM_MARCH", "haswell; rm -rf ~")
    with pytest.raises(ReslmError, match="RESLM_MARCH must be a compiler -march name"):
        native.march()
