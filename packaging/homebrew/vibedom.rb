# Homebrew formula for vibedom, ready for a tap (vibedom/homebrew-tap).
# It installs the signed darwin/arm64 release archive; update.sh rewrites
# the version and checksum from a release's SHA256SUMS.
class Vibedom < Formula
  desc "Run AI coding agents in a Linux VM whose files and network the host controls"
  homepage "https://github.com/vibedom/vibedom"
  url "https://github.com/vibedom/vibedom/releases/download/v0.1.0/vibedom_0.1.0_darwin_arm64.tar.gz"
  sha256 "0000000000000000000000000000000000000000000000000000000000000000"

  livecheck do
    url :stable
    strategy :github_latest
  end

  depends_on arch: :arm64
  depends_on macos: :sonoma

  def install
    bin.install "vibedom"
    doc.install "README.md", "INSTALL.md"
  end

  def caveats
    <<~EOS
      Run `vibedom init` once: it makes vibedom's keys and downloads and verifies
      the guest image and agent CLIs into ~/.vibedom. Then `vibedom run .` in a project.
    EOS
  end

  test do
    ENV["VIBEDOM_HOME"] = (testpath/"vibedom-home").to_s
    assert_match version.to_s, shell_output("#{bin}/vibedom version")
    pins = JSON.parse(shell_output("#{bin}/vibedom version --json"))["pins"]
    assert_match(/^v\d/, pins["alpine"])
    # Before `vibedom init` the report is complete but says what is missing.
    report = JSON.parse(shell_output("#{bin}/vibedom doctor --json", 1))
    assert_equal testpath/"vibedom-home", Pathname(report["home"])
    assert(report["checks"].any? { |c| c["name"] == "vibedom home" && c["status"] == "fail" })
  end
end
