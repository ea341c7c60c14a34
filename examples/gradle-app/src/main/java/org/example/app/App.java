package org.example.app;

import org.apache.commons.io.FilenameUtils;
import org.apache.commons.lang3.StringUtils;

/** Prints one line that needs both dependencies. */
public final class App {
    private App() {}

    public static void main(String[] args) {
        System.out.println(StringUtils.capitalize("gradle-app") + " " + FilenameUtils.getExtension("layer.tar"));
    }
}
